//! PNG plots with `plotters`, drawn into an RGB buffer and encoded with `image`.
//!
//! Text is rendered with ab_glyph from DejaVu Sans compiled into the binary (the `dejavu`
//! crate), so plotting needs no system fonts, fontconfig or network: it works the same on a
//! fresh machine, in CI and in a container.

use super::run_data::{EpochRow, Phases, RunData, PHASES};
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

/// Width and height of every plot, in pixels (the run directory's figure kind knows it).
pub const SIZE: (u32, u32) = crate::train::run_files::FIGURE_SIZE;

/// A function that draws one figure of a run into a PNG file.
pub type PlotFn = fn(&RunData, &Path) -> Result<(), String>;

/// The font family name the embedded font is registered under.
const FONT: &str = "sans-serif";

/// Colours of the phases, in the order of [`PHASES`].
const PHASE_COLORS: [RGBColor; 5] = [
    RGBColor(230, 159, 0),   // data wait: orange
    RGBColor(86, 180, 233),  // forward: sky blue
    RGBColor(0, 114, 178),   // backward: blue
    RGBColor(213, 94, 0),    // exposed comm: vermillion
    RGBColor(204, 121, 167), // update: purple
];

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid TrueType font compiled in; a failure would be a packaging bug,
        // and plotters then reports a font error on the first text drawn.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

fn err(e: impl std::fmt::Display) -> String {
    format!("plotting: {e}")
}

/// Draws with `draw` on a white canvas of [`SIZE`] and writes it to `path` as a PNG,
/// atomically.
fn render(
    path: &Path,
    draw: impl FnOnce(&DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>) -> Result<(), String>,
) -> Result<(), String> {
    register_font();
    let (w, h) = SIZE;
    let mut rgb = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        draw(&root)?;
        root.present().map_err(err)?;
    }
    let encoding = |e: png::EncodingError| format!("encoding {}: {e}", path.display());
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder
        .add_text_chunk(SOFTWARE.into(), "dptrain".into())
        .map_err(encoding)?;
    let mut writer = encoder.write_header().map_err(encoding)?;
    writer.write_image_data(&rgb).map_err(encoding)?;
    writer.finish().map_err(encoding)?;
    crate::output::write_atomically(path, &bytes, &PLOT_FILE).map_err(String::from)
}

/// The PNG text keyword that says which program made a figure (PNG's registered `Software`).
const SOFTWARE: &str = "Software";

/// A figure's kind: defined with the run directory's files, which include the figures.
pub use crate::train::run_files::PLOT_FILE;

/// `lo..hi` padded by 5% (and made non-empty when all values are equal).
fn padded(values: impl Iterator<Item = f64>, floor_zero: bool) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    if floor_zero {
        lo = lo.min(0.0);
    }
    let pad = ((hi - lo) * 0.05).max(1e-3);
    (if floor_zero { lo } else { lo - pad })..hi + pad
}

/// The runs of consecutive points whose values are numbers: an epoch whose value is not one
/// (a test loss that overflowed, recorded as null) is a gap in its line, never drawn as 0.
fn finite_segments(points: &[(f64, f64)]) -> Vec<Vec<(f64, f64)>> {
    points
        .split(|p| !p.1.is_finite())
        .filter(|s| !s.is_empty())
        .map(<[_]>::to_vec)
        .collect()
}

/// A line's label, colour and `(epoch, value)` points.
type Series<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

/// Lines of `(epoch, value)`, one per series, and a vertical line at each epoch position of
/// `lost` (where `dptrain launch` lost a host).
fn epoch_lines(
    path: &Path,
    title: &str,
    y_desc: &str,
    series: &[Series<'_>],
    floor_zero: bool,
    lost: &[f64],
) -> Result<(), String> {
    let last = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let y = padded(
        series.iter().flat_map(|s| s.2.iter().map(|p| p.1)),
        floor_zero,
    );
    render(path, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 24))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0.5..last + 0.5, y.clone())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("epoch")
            .y_desc(y_desc)
            .x_labels((last as usize + 1).min(12))
            .x_label_formatter(&|x| {
                if (x - x.round()).abs() < 1e-6 && *x >= 1.0 {
                    format!("{x:.0}")
                } else {
                    String::new()
                }
            })
            .label_style((FONT, 14))
            .draw()
            .map_err(err)?;
        for (label, color, points) in series {
            let color = *color;
            chart
                .draw_series(
                    finite_segments(points)
                        .into_iter()
                        .map(|s| PathElement::new(s, color.stroke_width(2))),
                )
                .map_err(err)?
                .label(*label)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(
                    points
                        .iter()
                        .filter(|p| p.1.is_finite())
                        .map(|&p| Circle::new(p, 4, color.filled())),
                )
                .map_err(err)?;
        }
        for (i, &x) in lost.iter().enumerate() {
            let line = PathElement::new([(x, y.start), (x, y.end)], BLACK.stroke_width(1));
            let drawn = chart.draw_series(std::iter::once(line)).map_err(err)?;
            if i == 0 {
                drawn.label("host lost (dptrain launch)").legend(|(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(1))
                });
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font((FONT, 14))
            .draw()
            .map_err(err)
    })
}

/// Training and test loss per epoch.
pub fn loss(run: &RunData, path: &Path) -> Result<(), String> {
    let pts = |f: fn(&EpochRow) -> f64| -> Vec<(f64, f64)> {
        run.epochs.iter().map(|e| (e.epoch as f64, f(e))).collect()
    };
    epoch_lines(
        path,
        &format!("Loss per epoch: {}", run.name()),
        "cross-entropy loss",
        &[
            ("train loss (worker 0)", BLUE, pts(|e| e.train_loss)),
            ("test loss", RED, pts(|e| e.test_loss)),
        ],
        true,
        &run.lost_at_epochs(),
    )
}

/// Test accuracy per epoch, in percent.
pub fn accuracy(run: &RunData, path: &Path) -> Result<(), String> {
    let pts = run
        .epochs
        .iter()
        .map(|e| (e.epoch as f64, 100.0 * e.test_accuracy))
        .collect();
    epoch_lines(
        path,
        &format!("Test accuracy per epoch: {}", run.name()),
        "test accuracy, %",
        &[("test accuracy", RGBColor(0, 158, 115), pts)],
        false,
        &run.lost_at_epochs(),
    )
}

/// Stacked bars, one per `(label, phase ms)`: data wait, forward, backward, exposed comm,
/// update, bottom to top.
fn stacked_bars(path: &Path, title: &str, bars: &[(String, [f64; 5])]) -> Result<(), String> {
    let n = bars.len().max(1);
    // Room for the legend above the tallest bar; 1 ms where no bar has a timed step (a
    // scale of thousandths of nothing says nothing).
    let tallest = bars
        .iter()
        .map(|b| b.1.iter().sum::<f64>())
        .fold(0.0, f64::max);
    let top = if tallest > 0.0 { tallest } else { 1.0 } * 1.5;
    render(path, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 24))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..n as f64, 0.0..top)
            .map_err(err)?;
        let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc("ms per step")
            .x_labels(2 * n + 1)
            .x_label_formatter(&|x| centred_label(&labels, *x))
            .label_style((FONT, 14))
            .draw()
            .map_err(err)?;
        for (p, name) in PHASES.iter().enumerate() {
            let color = PHASE_COLORS[p];
            let rects = bars.iter().enumerate().map(|(i, (_, ms))| {
                let base: f64 = ms[..p].iter().sum();
                let x = i as f64;
                Rectangle::new([(x + 0.2, base), (x + 0.8, base + ms[p])], color.filled())
            });
            chart
                .draw_series(rects)
                .map_err(err)?
                .label(*name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 12, y + 6)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font((FONT, 14))
            .draw()
            .map_err(err)
    })
}

/// The step breakdown of each epoch as stacked bars.
pub fn breakdown_per_epoch(run: &RunData, path: &Path) -> Result<(), String> {
    let bars: Vec<(String, [f64; 5])> = run
        .epochs
        .iter()
        .map(|e| {
            (
                bar_label(format!("epoch {}", e.epoch), &e.phases),
                e.phases.ms,
            )
        })
        .collect();
    stacked_bars(
        path,
        &format!("Where a step's time goes: {}", run.name()),
        &bars,
    )
}

/// A breakdown bar's label: says so where there is no timed step (all within the warm-up),
/// which draws no bar.
fn bar_label(name: String, phases: &Phases) -> String {
    if phases.step_ms > 0.0 {
        name
    } else {
        format!("{name} (no timed step)")
    }
}

/// The mean step breakdown of each run as stacked bars, side by side.
pub fn breakdown_per_run(runs: &[RunData], path: &Path) -> Result<(), String> {
    let bars: Vec<(String, [f64; 5])> = runs
        .iter()
        .map(|r| (bar_label(r.name(), &r.phases), r.phases.ms))
        .collect();
    stacked_bars(path, "Where a step's time goes, per run", &bars)
}

/// Colours of the series of [`grouped_bars`] and [`log_x_lines`], in order (Okabe-Ito, as
/// the phases; repeated past eight series).
const SERIES_COLORS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(230, 159, 0),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(240, 228, 66),
    RGBColor(0, 0, 0),
];

/// One series of a chart: its legend label and its values (one per group for bars, `(x, y)`
/// points for lines).
pub type NamedSeries<T> = (String, Vec<T>);

/// Bars grouped along the x axis: one group per `groups` label, one bar per series within a
/// group (series `i`'s value for group `g` is `series[i].1[g]`; a missing or non-finite value
/// draws no bar). Used by the benchmark suite (step time per model and thread count, the
/// overlap grid, the ablation's images/s).
pub fn grouped_bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    groups: &[String],
    series: &[NamedSeries<f64>],
) -> Result<(), String> {
    let n = groups.len().max(1);
    let per_group = series.len().max(1);
    let top = series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        .max(1e-3)
        * if series.len() > 1 { 1.35 } else { 1.1 }; // Room for the legend.
    render(path, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 22))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(72)
            .build_cartesian_2d(0.0..n as f64, 0.0..top)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc(y_desc)
            .x_labels(2 * n + 1)
            .x_label_formatter(&|x| centred_label(groups, *x))
            .label_style((FONT, 13))
            .draw()
            .map_err(err)?;
        let width = 0.8 / per_group as f64;
        for (s, (label, values)) in series.iter().enumerate() {
            let color = SERIES_COLORS[s % SERIES_COLORS.len()];
            let rects = values
                .iter()
                .enumerate()
                .filter(|(g, v)| *g < n && v.is_finite())
                .map(|(g, &v)| {
                    let x = g as f64 + 0.1 + s as f64 * width;
                    Rectangle::new([(x, 0.0), (x + width * 0.9, v)], color.filled())
                });
            let drawn = chart.draw_series(rects).map_err(err)?;
            if series.len() > 1 {
                drawn.label(label.as_str()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 12, y + 6)], color.filled())
                });
            }
        }
        if series.len() > 1 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .label_font((FONT, 13))
                .draw()
                .map_err(err)?;
        }
        Ok(())
    })
}

/// Lines of `(bytes, y)` points on a log2 x axis labelled in bytes (e.g. bus bandwidth against
/// message size), one per series; x values must be positive.
pub fn log_x_lines(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[NamedSeries<(f64, f64)>],
) -> Result<(), String> {
    // Plotted at log2(x) on a linear axis, so ticks fall on whole powers of two.
    let series: Vec<NamedSeries<(f64, f64)>> = series
        .iter()
        .map(|(label, points)| {
            let points = points
                .iter()
                .filter(|p| p.0 > 0.0)
                .map(|&(x, y)| (x.log2(), y))
                .collect();
            (label.clone(), points)
        })
        .collect();
    let x = padded(series.iter().flat_map(|s| s.1.iter().map(|p| p.0)), false);
    let x = x.start.floor() - 0.5..x.end.ceil() + 0.5;
    let y = padded(series.iter().flat_map(|s| s.1.iter().map(|p| p.1)), true);
    let y = y.start..y.end * 1.3; // Room for the legend.
    let ticks = (x.end - x.start).round() as usize + 1;
    render(path, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 22))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(72)
            .build_cartesian_2d(x, y)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_labels(ticks)
            .x_label_formatter(&|x| {
                let even = (x / 2.0).round() * 2.0;
                if (x - even).abs() < 1e-6 {
                    human_bytes(even.exp2())
                } else {
                    String::new()
                }
            })
            .label_style((FONT, 13))
            .draw()
            .map_err(err)?;
        for (s, (label, points)) in series.iter().enumerate() {
            let color = SERIES_COLORS[s % SERIES_COLORS.len()];
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font((FONT, 13))
            .draw()
            .map_err(err)
    })
}

/// `4K`, `64M`: a byte count in binary units, for axis labels.
fn human_bytes(x: f64) -> String {
    let (v, unit) = if x >= (1u64 << 30) as f64 {
        (x / (1u64 << 30) as f64, "G")
    } else if x >= (1 << 20) as f64 {
        (x / (1 << 20) as f64, "M")
    } else if x >= 1024.0 {
        (x / 1024.0, "K")
    } else {
        (x, "")
    };
    format!("{}{unit}", (v * 10.0).round() / 10.0)
}

/// The x-axis label at `x` for bars (or groups) centred on `i + 0.5`: `labels[i]` there, empty
/// elsewhere (the axis asks for ticks at every half unit).
fn centred_label(labels: &[String], x: f64) -> String {
    let i = (x - 0.5).round();
    if (x - 0.5 - i).abs() < 1e-6 && i >= 0.0 {
        labels.get(i as usize).cloned().unwrap_or_default()
    } else {
        String::new()
    }
}

/// A confusion matrix as a heat map: row `t` (true class), column `p` (predicted) shaded by the
/// share of class `t`'s samples predicted as `p` (`counts` is row-major, `names.len()`
/// squared); with up to 20 classes each cell shows its count and the axes the class names.
pub fn confusion_matrix(
    path: &Path,
    title: &str,
    names: &[String],
    counts: &[u64],
) -> Result<(), String> {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let k = names.len().max(1);
    if counts.len() != names.len() * names.len() {
        return Err("plotting: the confusion matrix is not square in the classes".into());
    }
    let labelled = k <= 20;
    let short =
        |v: &[String]| -> Vec<String> { v.iter().map(|n| n.chars().take(12).collect()).collect() };
    let (across, down) = if labelled {
        let rev: Vec<String> = names.iter().rev().cloned().collect();
        (short(names), short(&rev))
    } else {
        (Vec::new(), Vec::new())
    };
    render(path, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 22))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(110)
            .build_cartesian_2d(0.0..k as f64, 0.0..k as f64)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc("predicted class")
            .y_desc("true class")
            .x_labels(2 * k + 1)
            .y_labels(2 * k + 1)
            .x_label_formatter(&|x| centred_label(&across, *x))
            .y_label_formatter(&|y| centred_label(&down, *y))
            .label_style((FONT, 12))
            .draw()
            .map_err(err)?;
        let centre = Pos::new(HPos::Center, VPos::Center);
        for t in 0..k {
            let row = &counts[t * k..(t + 1) * k];
            let total = row.iter().sum::<u64>().max(1) as f64;
            let y = (k - 1 - t) as f64;
            let cells = row.iter().enumerate().map(|(p, &c)| {
                let shade = (255.0 * (1.0 - c as f64 / total)) as u8;
                let colour = RGBColor(shade, shade, 255);
                Rectangle::new([(p as f64, y), (p as f64 + 1.0, y + 1.0)], colour.filled())
            });
            chart.draw_series(cells).map_err(err)?;
            if labelled {
                let texts = row.iter().enumerate().map(|(p, &c)| {
                    let dark = c as f64 / total > 0.5;
                    let colour = if dark { &WHITE } else { &BLACK };
                    let style = (FONT, 12).into_font().color(colour).pos(centre);
                    Text::new(c.to_string(), (p as f64 + 0.5, y + 0.5), style)
                });
                chart.draw_series(texts).map_err(err)?;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_that_is_not_a_number_is_a_gap_in_its_line() {
        let p = [
            (1.0, 2.0),
            (2.0, f64::NAN),
            (3.0, 1.5),
            (4.0, 1.0),
            (5.0, f64::INFINITY),
        ];
        assert_eq!(
            finite_segments(&p),
            vec![vec![(1.0, 2.0)], vec![(3.0, 1.5), (4.0, 1.0)]]
        );
        assert!(finite_segments(&[(1.0, f64::NAN)]).is_empty());
    }
}
