//! Alpha-beta cost model for the communication modes.
//!
//! A message of `m` bytes costs `α + m·β`, with `α` = [`LinkModel::latency`]
//! and `β = 1 / bandwidth`. As in [`crate::comm::InProcessFabric`]'s emulation, every rank
//! has one full-duplex port: `m·β` is time the sender's transmit side and the
//! receiver's receive side are busy, while `α` is propagation delay that does
//! not occupy the port. A mode's time is therefore
//! `latency_terms·α + serialized_bytes·β`, where `latency_terms` counts the
//! `α`s on the critical path and `serialized_bytes` the bytes pushed through
//! the busiest port along it. With `n` = buffer bytes and `N` = world:
//!
//! * **Ring**: `2(N-1)` dependent rounds of `n/N` bytes →
//!   `2(N-1)α + 2(N-1)/N·nβ`.
//! * **Halving-doubling**, `N` a power of two: `2·log2 N` dependent rounds
//!   moving `n/2, n/4, …` each way → `2·log2(N)α + 2(N-1)/N·nβ`. Otherwise,
//!   with `p2` = largest power of two `≤ N`, the fold-in and hand-back steps
//!   add a full-buffer message each: `2(log2 p2 + 1)α + (2(p2-1)/p2 + 2)·nβ`.
//! * **Tree**: reduce and broadcast are `⌈log2 N⌉` dependent rounds of full
//!   buffers each → `2⌈log2 N⌉(α + nβ)`.
//! * **Redundant**: each rank pushes `N-1` full copies through its single
//!   transmit port, and concurrently (full duplex) pulls `N-1` copies through
//!   its receive port, so the port time is `(N-1)·nβ`. The textbook bound
//!   `(N-1)(α + nβ)` also charges `α` per copy, which is right when `α` is a
//!   per-message CPU/NIC overhead that blocks the port. Here `α` is pure
//!   propagation and the `N-1` sends are independent (nothing waits for a
//!   reply), so the latencies overlap and only the last message's `α` is
//!   exposed: `α + (N-1)·nβ`. That is what the emulator measures (see the
//!   `emulated_latency_matches_model` test); using the textbook form would
//!   overstate redundant mode's cost exactly in the small-message regime where
//!   it is the best choice.
//!
//! Local additions are ignored (memory-bound and far cheaper than the network
//! for the link speeds this is meant for). A simulator can reuse the same
//! per-mode counts through [`cost_terms`].
//!
//! **On a cluster of hosts** ([`Cluster`], [`route_time`]): `P` hosts of `d` workers, ranks
//! host-major, each worker with a port onto its host (`intra`) and every host one NIC that its
//! workers share (`nic`), as in the simulator's topology (`sim::topology`). A collective is
//! priced round by round: in each round every message is a hop over its link, and the
//! messages that leave one host in that round share its NIC, so a round costs
//! `max(α_intra + m·β_intra, α_nic + f·m·β_nic)` with `f` the most messages leaving one host
//! (counted from the algorithm's own pairing: ring's neighbours, halving-doubling's partners,
//! the binomial tree's children). That is what makes flat halving-doubling expensive on hosts
//! of several workers: its first rounds send half the buffer from every worker of a host
//! through the NIC at once (`f = d`), where the ring sends one chunk per host per round.
//! Redundant's copies are priced by port: the NIC carries `d(N-d)` copies, a worker's own
//! sends (one after another) `d-1` over its port and `N-d` over the NIC.
//! The hierarchies ([`crate::comm::hierarchical`]) add their phases: the leader's port takes
//! `d-1` whole buffers in and sends `d-1` out, then the leaders run the mode over `P` hosts;
//! 2-D moves `(d-1)/d` of the buffer each way through every port, and its `d` shard
//! collectives share the NIC (`f = d` on messages of `n/d`: the NIC's bytes of one
//! collective of `n`). With `d = 1` every formula is the flat one above.

use std::time::Duration;

use crate::comm::halving_doubling::prev_power_of_two;
use crate::comm::transport::secs_to_duration;
use crate::comm::{CommMode, Hierarchy, LinkModel};

/// The model's per-mode counts for one all-reduce of `bytes` bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostTerms {
    /// Number of `α` (latency) terms on the critical path.
    pub latency_terms: f64,
    /// Bytes serialized through the busiest port along the critical path
    /// (multiplied by `β` in the time estimate).
    pub serialized_bytes: f64,
    /// Messages sent by the busiest rank.
    pub messages_per_rank: usize,
    /// Bytes sent by the busiest rank.
    pub bytes_sent_per_rank: f64,
}

/// `⌈log2 n⌉` for n >= 1.
fn ceil_log2(n: usize) -> usize {
    n.next_power_of_two().trailing_zeros() as usize
}

/// Per-mode counts of the alpha-beta model (formulas in the module docs).
pub fn cost_terms(mode: CommMode, world: usize, bytes: usize) -> CostTerms {
    let zero = CostTerms {
        latency_terms: 0.0,
        serialized_bytes: 0.0,
        messages_per_rank: 0,
        bytes_sent_per_rank: 0.0,
    };
    // The implementations send nothing in these cases.
    if world <= 1 || bytes == 0 {
        return zero;
    }
    let n = bytes as f64;
    let nw = world as f64;
    match mode {
        CommMode::Ring => {
            let rounds = 2 * (world - 1);
            let moved = 2.0 * (nw - 1.0) / nw * n;
            CostTerms {
                latency_terms: rounds as f64,
                serialized_bytes: moved,
                messages_per_rank: rounds,
                bytes_sent_per_rank: moved,
            }
        }
        CommMode::HalvingDoubling => {
            let p2 = prev_power_of_two(world);
            let log = p2.trailing_zeros() as usize;
            let core = 2.0 * (p2 as f64 - 1.0) / p2 as f64 * n;
            if p2 == world {
                CostTerms {
                    latency_terms: (2 * log) as f64,
                    serialized_bytes: core,
                    messages_per_rank: 2 * log,
                    bytes_sent_per_rank: core,
                }
            } else {
                // Even ranks of the folded pairs: receive the partner's
                // buffer, run the core, then send it the result.
                CostTerms {
                    latency_terms: (2 * log + 2) as f64,
                    serialized_bytes: core + 2.0 * n,
                    messages_per_rank: 2 * log + 1,
                    bytes_sent_per_rank: core + n,
                }
            }
        }
        CommMode::Tree => {
            let rounds = 2 * ceil_log2(world);
            // The root sends ⌈log2 N⌉ broadcast messages; any other rank sends
            // one reduce message plus at most ⌈log2 N⌉-1 broadcast messages.
            let sent = ceil_log2(world);
            CostTerms {
                latency_terms: rounds as f64,
                serialized_bytes: rounds as f64 * n,
                messages_per_rank: sent,
                bytes_sent_per_rank: sent as f64 * n,
            }
        }
        CommMode::Redundant => {
            let copies = world - 1;
            CostTerms {
                latency_terms: 1.0,
                serialized_bytes: copies as f64 * n,
                messages_per_rank: copies,
                bytes_sent_per_rank: copies as f64 * n,
            }
        }
    }
}

/// Predicted wall time of one all-reduce of `bytes` bytes over `world` ranks, each with its
/// own port onto `link`.
pub fn predicted_time(mode: CommMode, world: usize, bytes: usize, link: &LinkModel) -> Duration {
    route_time(Route::Flat(mode), &Cluster::flat(world, *link), bytes)
}

/// Hosts of workers as the cost model sees them (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cluster {
    /// Hosts (processes).
    pub hosts: usize,
    /// Workers per host, sharing its NIC.
    pub per_host: usize,
    /// Each worker's port within its host.
    pub intra: LinkModel,
    /// Each host's NIC.
    pub nic: LinkModel,
}

impl Cluster {
    /// `world` workers, each alone behind a port onto `link` (one process's emulated link, or
    /// one worker per host).
    pub fn flat(world: usize, link: LinkModel) -> Self {
        Self {
            hosts: world,
            per_host: 1,
            intra: link,
            nic: link,
        }
    }

    /// Every worker.
    pub fn world(&self) -> usize {
        self.hosts * self.per_host
    }
}

/// How one bucket is reduced, as the cost model prices it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// The mode over every worker.
    Flat(CommMode),
    /// A hierarchy with the mode among hosts.
    Hierarchical(Hierarchy, CommMode),
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Flat(m) => write!(f, "{m}"),
            Self::Hierarchical(h, m) => write!(f, "{h}:{m}"),
        }
    }
}

/// Predicted wall time of one all-reduce of `bytes` bytes on `cluster` by `route` (see the
/// module docs).
pub fn route_time(route: Route, cluster: &Cluster, bytes: usize) -> Duration {
    let n = bytes as f64;
    let c = cluster;
    let secs = if bytes == 0 || c.world() <= 1 {
        0.0
    } else {
        match route {
            Route::Flat(mode) => Pricing::new(c, 1.0).flat(mode, n),
            Route::Hierarchical(h, mode) => {
                let d = c.per_host as f64;
                let hosts = Cluster::flat(c.hosts, c.nic);
                // Phases 1 and 3 through the busiest port, and phase 2 among the hosts.
                let (within, across) = match h {
                    Hierarchy::Leader => ((d - 1.0) * n, Pricing::new(&hosts, 1.0).flat(mode, n)),
                    Hierarchy::TwoD => {
                        ((d - 1.0) / d * n, Pricing::new(&hosts, d).flat(mode, n / d))
                    }
                };
                let within = if c.per_host > 1 {
                    2.0 * (c.intra.latency.as_secs_f64() + within / c.intra.bandwidth_bytes_per_s)
                } else {
                    0.0
                };
                within + if c.hosts > 1 { across } else { 0.0 }
            }
        }
    };
    secs_to_duration(secs)
}

/// Predicted time of one all-reduce of `len` f32 values by `route` with its messages in
/// `format`: [`route_time`] of the bytes on the wire, plus the busiest rank's conversions at
/// `rates` (it encodes what it sends, decodes what it receives, rounds its sum once).
pub fn wire_route_time(
    route: Route,
    cluster: &Cluster,
    len: usize,
    format: crate::comm::WireFormat,
    rates: &crate::comm::wire::WireRates,
) -> Duration {
    let bytes = len * format.bytes_per_value();
    // A hierarchy's phases within the host run in shared memory or between its threads, in
    // f32 whatever the wire: priced at the narrow bytes over a port of half the rate, they
    // cost what f32 does.
    let mut host = *cluster;
    if matches!(route, Route::Hierarchical(..)) {
        host.intra.bandwidth_bytes_per_s *= format.bytes_per_value() as f64 / 4.0;
    }
    let link = route_time(route, &host, bytes);
    if format == crate::comm::WireFormat::F32 || cluster.world() <= 1 {
        return link;
    }
    // Values the busiest rank sends across: the mode's, over the hosts for a hierarchy (on
    // a shard of 1/d of the buffer in two dimensions).
    let sent = match route {
        Route::Flat(mode) => cost_terms(mode, cluster.world(), len).bytes_sent_per_rank,
        Route::Hierarchical(Hierarchy::Leader, mode) => {
            cost_terms(mode, cluster.hosts, len).bytes_sent_per_rank
        }
        Route::Hierarchical(Hierarchy::TwoD, mode) => {
            cost_terms(mode, cluster.hosts, len.div_ceil(cluster.per_host.max(1)))
                .bytes_sent_per_rank
        }
    };
    // (cost_terms counts units of its size argument: here values.) A rank receives as much as
    // it sends in every mode but the tree's root, within a factor the rates' spread covers.
    link + secs_to_duration(rates.seconds(format, sent, sent, len as f64))
}

/// `--compress auto` for one bucket of `len` values reduced by `route`: bf16 where the link
/// time its halved bytes save outweighs the conversions counted twice, f32 otherwise. Twice:
/// the communication thread converts on a core, which delays the bucket
/// ([`wire_route_time`]) and, where every core also computes (workers x threads = cores, as
/// training runs), takes that time from backward too. Measured (docs/bench/compress.md): at
/// 10 Gbit/s, priced once, bf16 won 0.1 ms on paper and lost 2% of images/s. bf16, not fp16:
/// it converts faster (`bench compress`) and cannot overflow.
pub fn choose_wire(
    route: Route,
    cluster: &Cluster,
    len: usize,
    rates: &crate::comm::wire::WireRates,
) -> crate::comm::WireFormat {
    use crate::comm::WireFormat;
    let plain = wire_route_time(route, cluster, len, WireFormat::F32, rates);
    let packed = wire_route_time(route, cluster, len, WireFormat::Bf16, rates);
    let link_only = route_time(route, cluster, len * WireFormat::Bf16.bytes_per_value());
    let conversions = packed.saturating_sub(link_only);
    if packed + conversions < plain {
        WireFormat::Bf16
    } else {
        WireFormat::F32
    }
}

/// The route of `routes` with the smallest [`route_time`] (ties go to the earlier one).
pub fn choose_route(cluster: &Cluster, bytes: usize, routes: &[Route]) -> Option<Route> {
    let mut best: Option<(Route, Duration)> = None;
    for &r in routes {
        let t = route_time(r, cluster, bytes);
        if best.is_none_or(|(_, b)| t < b) {
            best = Some((r, t));
        }
    }
    best.map(|(r, _)| r)
}

/// Up to this many workers the tree is priced by walking it (O(workers x log workers));
/// past it, round by round.
const TREE_WALK_LIMIT: usize = 1 << 16;

/// One round of a collective (s): what its chain of dependent messages pays, the latency and
/// the transfer of its slowest hop, and the busiest port's time for all the round's messages.
#[derive(Clone, Copy, Debug)]
struct Round {
    chain: f64,
    alpha: f64,
    transfer: f64,
    occupancy: f64,
    /// Some sampled host sends fewer messages through its NIC than another.
    uneven: bool,
}

/// A flat collective priced round by round on a host-major cluster; `concurrent` collectives
/// like it run at once, sharing every NIC (the 2-D hierarchy's shards).
struct Pricing<'a> {
    c: &'a Cluster,
    concurrent: f64,
}

impl<'a> Pricing<'a> {
    fn new(c: &'a Cluster, concurrent: f64) -> Self {
        Self { c, concurrent }
    }

    fn host(&self, rank: usize) -> usize {
        rank / self.c.per_host
    }

    /// The hosts whose ranks a round is priced from, where every host has ranks that send:
    /// the first (which holds halving-doubling's folded pairs), the second, the middle and the
    /// last. Hosts are otherwise alike in ring's and halving-doubling's pairing, so this is
    /// exact for power-of-two shapes and a close sample otherwise, and a round costs O(workers
    /// per host) whatever the cluster's size.
    fn sampled_hosts(&self) -> Vec<usize> {
        let h = self.c.hosts;
        Self::distinct(vec![0, 1, h / 2, h.saturating_sub(1)], h)
    }

    /// `hosts` sorted, without repeats or hosts past `below`.
    fn distinct(mut hosts: Vec<usize>, below: usize) -> Vec<usize> {
        hosts.retain(|&x| x < below);
        hosts.sort_unstable();
        hosts.dedup();
        hosts
    }

    /// One round in which every rank `r` with a `partner(r)` sends it `m` bytes.
    /// `pipelined`: the ring, whose chain of dependent messages walks through every hop in
    /// turn (so it pays the hops' mean), where the others wait for their slowest hop.
    /// The ranks of `hosts` are the sample it is priced from.
    fn round(
        &self,
        hosts: &[usize],
        partner: impl Fn(usize) -> Option<usize>,
        m: f64,
        pipelined: bool,
    ) -> Round {
        let d = self.c.per_host;
        let (mut hops, mut chain_sum, mut slowest) = (0usize, 0.0f64, (0.0f64, 0.0f64));
        let (mut intra, mut flows, mut fewest) = (false, 0usize, usize::MAX);
        for &h in hosts {
            let mut leaving = 0;
            for from in h * d..(h + 1) * d {
                let Some(to) = partner(from) else { continue };
                let link = if self.host(to) == h {
                    intra = true;
                    &self.c.intra
                } else {
                    leaving += 1;
                    &self.c.nic
                };
                let (a, x) = (link.latency.as_secs_f64(), m / link.bandwidth_bytes_per_s);
                hops += 1;
                chain_sum += a + x;
                if a + x > slowest.0 + slowest.1 {
                    slowest = (a, x);
                }
            }
            flows = flows.max(leaving);
            fewest = fewest.min(leaving);
        }
        let intra_port = if intra {
            m / self.c.intra.bandwidth_bytes_per_s
        } else {
            0.0
        };
        let nic_port = flows as f64 * self.concurrent * m / self.c.nic.bandwidth_bytes_per_s;
        Round {
            chain: if pipelined {
                chain_sum / hops.max(1) as f64
            } else {
                slowest.0 + slowest.1
            },
            alpha: slowest.0,
            transfer: slowest.1,
            occupancy: intra_port.max(nic_port),
            uneven: fewest < flows,
        }
    }

    /// A sequence of dependent rounds, s. Where every host sends as many messages through its
    /// NIC, a round costs its chain (latency and one message's transfer) or the busiest port's
    /// time, whichever is longer: the messages a NIC queues arrive one transfer apart, each
    /// receiver goes on as its own arrives, so the latencies overlap the other transfers and
    /// the stagger does not grow; once, at the end, the last message's wait is added (a
    /// latency after a port-bound round, or its place in the queue, at most a latency). Where
    /// some host sends more than another (halving-doubling's fold, the tree's sparse senders,
    /// off powers of two), the ranks behind the longer queue hold up their partners: such a
    /// round costs its latency after the busiest port has sent everything.
    fn rounds(rounds: impl Iterator<Item = (Round, f64)>) -> f64 {
        let (mut t, mut queued) = (0.0f64, 0.0f64);
        for (r, times) in rounds {
            if r.uneven {
                t += times * (r.alpha + r.transfer.max(r.occupancy)).max(r.chain);
                continue;
            }
            t += times * r.chain.max(r.occupancy);
            let last = if r.occupancy > r.chain {
                r.alpha
            } else {
                r.alpha.min(r.occupancy - r.transfer).max(0.0)
            };
            queued = queued.max(last);
        }
        t + queued
    }

    /// `mode` over every rank of the cluster on a buffer of `n` bytes, s.
    fn flat(&self, mode: CommMode, n: f64) -> f64 {
        let world = self.c.world();
        if world <= 1 || n == 0.0 {
            return 0.0;
        }
        match mode {
            CommMode::Ring => {
                let next = |r: usize| Some((r + 1) % world);
                let round = self.round(&self.sampled_hosts(), next, n / world as f64, true);
                Self::rounds(std::iter::once((round, 2.0 * (world - 1) as f64)))
            }
            CommMode::HalvingDoubling => self.halving_doubling(n),
            CommMode::Tree if world <= TREE_WALK_LIMIT => 2.0 * self.subtree(0, world, n),
            CommMode::Tree => {
                // Reduce and broadcast: the same rounds, each way.
                let mut rounds = Vec::new();
                let mut mask = 1;
                while mask < world {
                    let child = |v: usize| (v & mask != 0 && v & (mask - 1) == 0).then(|| v - mask);
                    // The senders are the odd multiples of `mask`: sample their hosts.
                    let odd = |k: usize| (2 * k + 1) * mask;
                    let last = (world - 1 - mask) / (2 * mask);
                    let senders = [odd(0), odd(1), odd(last / 2), odd(last)];
                    let hosts = Self::distinct(
                        senders.iter().map(|&r| self.host(r)).collect(),
                        self.c.hosts,
                    );
                    rounds.push((self.round(&hosts, child, n, false), 2.0));
                    mask <<= 1;
                }
                Self::rounds(rounds.into_iter())
            }
            CommMode::Redundant => self.redundant(n),
        }
    }

    /// The binomial tree's reduce of the subtree rooted at `root` over ranks `root..root +
    /// size`, s: each child's message leaves when the child's own subtree is done and the
    /// root's receiving port (its NIC for a child on another host) is free, so a child whose
    /// subtree stayed within a host arrives early while a sibling's crossed the network (the
    /// broadcast is the same tree, backwards).
    fn subtree(&self, root: usize, size: usize, n: f64) -> f64 {
        let world = self.c.world();
        let (mut done, mut port_free, mut nic_free) = (0.0f64, 0.0f64, 0.0f64);
        let mut mask = 1;
        while mask < size && root + mask < world {
            let child = root + mask;
            let ready = self.subtree(child, mask, n);
            let c = self.c;
            // The concurrent collectives' messages share a NIC.
            let (free, link, sharing) = if self.host(child) == self.host(root) {
                (&mut port_free, &c.intra, 1.0)
            } else {
                (&mut nic_free, &c.nic, self.concurrent)
            };
            let start = ready.max(*free);
            *free = start + sharing * n / link.bandwidth_bytes_per_s;
            done = done.max(*free + link.latency.as_secs_f64());
            mask <<= 1;
        }
        done
    }

    fn halving_doubling(&self, n: f64) -> f64 {
        let world = self.c.world();
        let p2 = prev_power_of_two(world);
        let rem = world - p2;
        let real = |v: usize| if v < rem { 2 * v } else { v + rem };
        // The virtual rank of a real one in the power-of-two core (the folded odd ones sit out).
        let virtual_rank = |r: usize| match r {
            r if r < 2 * rem && r % 2 == 1 => None,
            r if r < 2 * rem => Some(r / 2),
            r => Some(r - rem),
        };
        let mut rounds = Vec::new();
        if rem > 0 {
            // Fold-in and hand-back: whole buffers between the pairs.
            let fold = |r: usize| (r < 2 * rem && r % 2 == 1).then(|| r - 1);
            rounds.push((self.round(&self.sampled_hosts(), fold, n, false), 2.0));
        }
        let mut mask = p2 / 2;
        while mask >= 1 {
            // Halving and doubling rounds at this distance both send `mask` chunks each way.
            let partner = |r: usize| virtual_rank(r).map(|v| real(v ^ mask));
            let m = mask as f64 * n / p2 as f64;
            rounds.push((self.round(&self.sampled_hosts(), partner, m, false), 2.0));
            mask /= 2;
        }
        Self::rounds(rounds.into_iter())
    }

    fn redundant(&self, n: f64) -> f64 {
        let c = self.c;
        let (world, d) = (c.world() as f64, c.per_host as f64);
        let copies_out = world - d;
        let (bi, bx) = (
            1.0 / c.intra.bandwidth_bytes_per_s,
            1.0 / c.nic.bandwidth_bytes_per_s,
        );
        let nic = self.concurrent * d * copies_out * n * bx;
        let own = (d - 1.0) * n * bi + copies_out * n * bx * self.concurrent;
        let alpha = match (d > 1.0, copies_out > 0.0) {
            (true, true) => c.nic.latency.max(c.intra.latency).as_secs_f64(),
            (_, true) => c.nic.latency.as_secs_f64(),
            _ => c.intra.latency.as_secs_f64(),
        };
        alpha + nic.max(own)
    }
}

/// The mode with the smallest [`predicted_time`] (ties go to the earlier
/// entry of [`CommMode::ALL`]).
pub fn choose_mode(world: usize, bytes: usize, link: &LinkModel) -> CommMode {
    let mut best = CommMode::ALL[0];
    let mut best_t = predicted_time(best, world, bytes, link);
    for mode in &CommMode::ALL[1..] {
        let t = predicted_time(*mode, world, bytes, link);
        if t < best_t {
            best = *mode;
            best_t = t;
        }
    }
    best
}

/// The bytes `link` moves in one latency (`bandwidth x latency`): a message smaller than this
/// spends more time waiting on latency than transferring. `--comm auto` uses it as the bucket
/// cap when none is given (see `plan::bucket_caps`).
pub fn min_bucket_bytes(link: &LinkModel) -> usize {
    let bytes = link.bandwidth_bytes_per_s * link.latency.as_secs_f64();
    if bytes.is_finite() && bytes > 0.0 {
        bytes.min(usize::MAX as f64 / 2.0) as usize
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(bw: &str, lat: &str) -> LinkModel {
        LinkModel {
            bandwidth_bytes_per_s: crate::comm::parse_bandwidth(bw).unwrap(),
            latency: crate::comm::parse_duration(lat).unwrap(),
        }
    }

    #[test]
    fn choice_is_the_argmin() {
        let links = [
            link("10Gbit", "5us"),
            link("1Gbit", "1ms"),
            link("100GB/s", "0"),
        ];
        for l in &links {
            for world in 1..=33 {
                for bytes in [0usize, 4, 4096, 1 << 20, 100 << 20] {
                    let chosen = choose_mode(world, bytes, l);
                    let t = predicted_time(chosen, world, bytes, l);
                    for m in CommMode::ALL {
                        assert!(
                            t <= predicted_time(m, world, bytes, l),
                            "{world} {bytes} {m}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn regimes() {
        // Tiny message, big latency: a single round wins.
        let slow = link("10Gbit", "1ms");
        assert_eq!(choose_mode(8, 4, &slow), CommMode::Redundant);
        assert_ne!(choose_mode(8, 4, &slow), CommMode::Ring);
        // Big message, many ranks: bandwidth-optimal modes win.
        let fast = link("10Gbit", "5us");
        assert_eq!(choose_mode(8, 100 << 20, &fast), CommMode::HalvingDoubling);
        // Non-power-of-two pays hd's fold-in, so ring wins.
        assert_eq!(choose_mode(6, 100 << 20, &fast), CommMode::Ring);
    }

    #[test]
    fn formulas() {
        let l = LinkModel {
            bandwidth_bytes_per_s: 1e9,
            latency: Duration::from_micros(10),
        };
        let n = 1_000_000usize;
        let secs = |m| predicted_time(m, 4, n, &l).as_secs_f64();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(secs(CommMode::Ring), 6.0 * 1e-5 + 1.5e-3));
        assert!(close(secs(CommMode::HalvingDoubling), 4.0 * 1e-5 + 1.5e-3));
        assert!(close(secs(CommMode::Tree), 4.0 * (1e-5 + 1e-3)));
        assert!(close(secs(CommMode::Redundant), 1e-5 + 3e-3));
        // Non-power-of-two hd: 5 ranks -> p2 = 4 core plus two full messages.
        let hd5 = predicted_time(CommMode::HalvingDoubling, 5, n, &l).as_secs_f64();
        assert!(close(hd5, 6.0 * 1e-5 + 3.5e-3));
        assert_eq!(cost_terms(CommMode::Tree, 1, n).latency_terms, 0.0);
        assert_eq!(cost_terms(CommMode::Tree, 5, n).messages_per_rank, 3);
    }
}
