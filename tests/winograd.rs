//! Winograd convolutions (`--conv-algo winograd`, `winograd:2`) against direct convolution
//! (im2col + GEMM, itself checked against plain loops in tests/reference_backend): forward,
//! input gradient and weight gradient over a grid of channel counts, odd sizes and sizes not a
//! multiple of the tile, paddings 0-2 and batch 1; the same bits for any thread count; and
//! `auto`'s rule. The errors measured here are the ones docs/bench/winograd.md quotes.

use dptrain::backend::{
    default_kernels, sum_order, winograd_applies, Act, ConvAlgo, ConvGeom, Kernels, WinogradTile,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// A 3x3 stride-1 convolution of `c` to `o` channels on `h x w` with padding `pad`.
fn geom(c: usize, o: usize, h: usize, w: usize, pad: usize) -> ConvGeom {
    ConvGeom {
        c,
        h,
        w,
        o,
        oh: h + 2 * pad - 2,
        ow: w + 2 * pad - 2,
        kh: 3,
        kw: 3,
        sh: 1,
        sw: 1,
        ph: pad,
        pw: pad,
        dh: 1,
        dw: 1,
        groups: 1,
    }
}

fn kernels(algo: ConvAlgo) -> Box<dyn Kernels> {
    let mut k = default_kernels();
    k.set_batch_chunk(sum_order::BATCH_CHUNK);
    k.set_conv_algo(algo);
    k
}

/// Forward output (bias and ReLU fused), weight-and-bias gradient and input gradient (added to
/// a non-zero buffer, so accumulation is checked too) of one convolution.
fn run(algo: ConvAlgo, g: &ConvGeom, n: usize, seed: u64) -> [Vec<f32>; 3] {
    let mut k = kernels(algo);
    let x = random(n * g.in_len(), seed);
    let w = random(g.weight_len(), seed + 1);
    let bias = random(g.o, seed + 2);
    let dy = random(n * g.out_len(), seed + 3);
    let mut y = vec![0.0; n * g.out_len()];
    k.conv2d_forward(g, n, &x, &w, Some(&bias), Act::Relu, &mut y);
    let mut dwb = vec![0.0; g.weight_len() + g.o];
    let mut dx = random(n * g.in_len(), seed + 4);
    k.conv2d_backward(g, n, &x, &w, &dy, &mut dwb, true, Some((&mut dx, true)));
    [y, dwb, dx]
}

/// The largest difference relative to the largest magnitude of `want` (a normwise relative
/// error: Winograd's rounding scales with the tile's values, not with each output's size).
fn rel_error(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0f32, f32::max)
        / scale
}

/// Bounds on the normwise relative error against direct convolution, per tile: F(2x2, 3x3)'s
/// points 0, +-1 add little rounding; F(4x4, 3x3)'s +-2 and the 1/6, 1/24 of `G` more (Lavin &
/// Gray report F(4x4) about 10x F(2x2)'s error). Measured worst over this grid: see the
/// printed figures (`cargo test --test winograd -- --nocapture`).
fn bound(tile: WinogradTile) -> f32 {
    match tile {
        WinogradTile::F2 => 5e-6,
        WinogradTile::F4 => 2e-5,
    }
}

#[test]
fn winograd_matches_direct_over_a_grid_of_shapes() {
    let shapes = [
        // (c, o, h, w, pad)
        (1, 1, 3, 3, 0),
        (1, 2, 1, 1, 1),
        (3, 4, 5, 7, 1),
        (3, 5, 6, 6, 0),
        (4, 3, 7, 5, 2),
        (16, 16, 8, 8, 1),
        (17, 9, 9, 11, 1),
        (8, 33, 4, 4, 1),
        (32, 32, 13, 3, 1),
        (64, 64, 4, 4, 1),
        // More input channels than one packed block of the GEMM holds (KC = 384 rows):
        // forward, then the input gradient's flipped kernel.
        (400, 20, 4, 4, 1),
        (20, 400, 3, 3, 1),
    ];
    for tile in [WinogradTile::F2, WinogradTile::F4] {
        let mut worst = [0f32; 3];
        for (i, &(c, o, h, w, pad)) in shapes.iter().enumerate() {
            let g = geom(c, o, h, w, pad);
            assert!(winograd_applies(&g));
            for n in [1, 3] {
                let seed = 100 * i as u64 + n as u64;
                let got = run(ConvAlgo::Winograd(tile), &g, n, seed);
                let want = run(ConvAlgo::Direct, &g, n, seed);
                for (part, name) in ["forward", "weight gradient", "input gradient"]
                    .iter()
                    .enumerate()
                {
                    let e = rel_error(&got[part], &want[part]);
                    worst[part] = worst[part].max(e);
                    assert!(
                        e <= bound(tile),
                        "{tile:?} {name}: c {c} o {o} {h}x{w} pad {pad} batch {n}: relative error {e:.2e} over {:.0e}",
                        bound(tile)
                    );
                }
            }
        }
        eprintln!(
            "{tile:?}: worst relative error forward {:.2e}, weight gradient {:.2e}, input gradient {:.2e}",
            worst[0], worst[1], worst[2]
        );
    }
}

#[test]
fn winograd_is_not_direct() {
    // The comparison above would pass trivially if the setting were ignored: Winograd's
    // rounding differs from direct convolution's somewhere.
    let g = geom(16, 16, 8, 8, 1);
    for tile in [WinogradTile::F2, WinogradTile::F4] {
        let got = run(ConvAlgo::Winograd(tile), &g, 2, 9);
        let want = run(ConvAlgo::Direct, &g, 2, 9);
        assert_ne!(got[0], want[0], "{tile:?}: forward is direct's bits");
        assert_ne!(
            got[1], want[1],
            "{tile:?}: weight gradient is direct's bits"
        );
        assert_ne!(got[2], want[2], "{tile:?}: input gradient is direct's bits");
    }
}

#[test]
fn winograd_gives_the_same_bits_on_any_thread_count() {
    let g = geom(24, 40, 11, 9, 1);
    for tile in [WinogradTile::F2, WinogradTile::F4] {
        let on = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| run(ConvAlgo::Winograd(tile), &g, 5, 3))
        };
        let one = on(1);
        for threads in [2, 3, 7] {
            assert_eq!(on(threads), one, "{tile:?}: {threads} threads");
        }
    }
}

#[test]
fn auto_uses_winograd_only_where_it_applies_and_pays() {
    let wide = geom(64, 64, 8, 8, 1);
    assert_eq!(
        ConvAlgo::Auto.tile_for(&wide),
        Some(WinogradTile::F4),
        "a 64-channel 3x3 layer"
    );
    assert_eq!(
        ConvAlgo::Auto.tile_for(&geom(64, 64, 4, 4, 1)),
        Some(WinogradTile::F2),
        "a 4x4 output"
    );
    assert_eq!(
        ConvAlgo::Auto.tile_for(&geom(3, 64, 32, 32, 1)),
        None,
        "an RGB stem"
    );
    assert_eq!(
        ConvAlgo::Auto.tile_for(&geom(16, 16, 32, 32, 1)),
        Some(WinogradTile::F4),
        "16 channels"
    );
    assert_eq!(
        ConvAlgo::Auto.tile_for(&geom(8, 16, 32, 32, 1)),
        None,
        "8 channels in"
    );
    // The weight gradient by Winograd from an 8x8 output; every forced Winograd uses it.
    assert_eq!(
        ConvAlgo::Auto.weight_grad_tile(&wide),
        Some(WinogradTile::F4)
    );
    let small = geom(64, 64, 4, 4, 1);
    assert_eq!(
        ConvAlgo::Auto.weight_grad_tile(&small),
        None,
        "a 4x4 output"
    );
    assert_eq!(
        ConvAlgo::Winograd(WinogradTile::F4).weight_grad_tile(&small),
        Some(WinogradTile::F4)
    );
    let strided = ConvGeom {
        sh: 2,
        sw: 2,
        oh: 4,
        ow: 4,
        ..wide
    };
    assert_eq!(ConvAlgo::Auto.tile_for(&strided), None, "stride 2");
    assert_eq!(
        ConvAlgo::Winograd(WinogradTile::F2).tile_for(&strided),
        None,
        "stride 2, even when asked"
    );
    assert_eq!(ConvAlgo::Direct.tile_for(&wide), None);
    for s in ["direct", "winograd", "winograd:2", "auto"] {
        let a: ConvAlgo = s.parse().unwrap();
        assert_eq!(a.to_string().parse::<ConvAlgo>().unwrap(), a, "{s}");
    }
    let e = "winograd:3".parse::<ConvAlgo>().unwrap_err();
    assert!(e.contains("winograd:3"), "{e}");
}
