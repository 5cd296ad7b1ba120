//! The emulated device: a worker's compute held to the times of a measured profile, for
//! testbeds where many workers share a few cores.
//!
//! Why: the namespace cluster of `scripts/cluster.sh` gives every "host" its own network stack
//! and shaped link, but not its own cores: up to 8 workers share this machine's 2. Their
//! compute then waits for a core as much as their messages wait for the link, and how long
//! depends on the OS scheduler, which no cluster simulator models (a real cluster has a device
//! per worker). `--emulate-device PROFILE --emulate-device-scale K` gives each worker a device
//! of its own the way `--link-bandwidth` gives it a link: by sleeping. The compute still runs
//! for real (the run trains), and each phase then waits until the time the profile gives it,
//! times K: forward until `K x` the profile's forward, each parameter block's backward until
//! `K x` the profile's backward up to where that block is written (before its layer's input
//! gradient where the profile has one; so its bucket goes out when the device would have
//! produced it), the update until `K x` its update. With K a few times the workers per
//! core (3x kept the namespace cluster's compute within 3.2% of the device's time; 1.5x let
//! lenet5 overrun it by 13%), the real compute fits inside the device's
//! time and every worker's step takes what the profile says, whoever else shares the cores.
//! A phase whose real compute takes longer than its device time is not shortened; the run's
//! step breakdown shows it.
//!
//! The profile is the JSON of `dptrain profile`, in the one profile format
//! ([`crate::measure::Profile`]) the simulator reads too.

use crate::measure::Profile;
use crate::nn::GradSink;
use std::path::Path;
use std::time::{Duration, Instant};

/// Lowers the calling compute thread to nice 19. An emulated device's real compute has time to
/// spare (the device's time is longer), and a real cluster's communication threads never wait
/// for a device's compute to give up a core; at nice 5 (the trainer's default, see
/// `parallel::yield_cpu_to_communication`) they did, on cores shared by 8 workers.
pub fn lower_compute_priority() {
    crate::parallel::set_niceness(19);
}

/// A device's time for each phase of one worker's step (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct EmulatedDevice {
    /// The profile file it was read from.
    pub path: std::path::PathBuf,
    /// The factor applied to the profile's times.
    pub scale: f64,
    /// The model the profile is of.
    pub model: String,
    /// The per-worker batch the profile's times are for.
    pub batch: usize,
    /// Forward and loss.
    pub forward: Duration,
    /// Per parameter block (in forward order): the device's forward of that block (with the
    /// layers the profile counts with it).
    forward_of: Vec<Duration>,
    /// Per parameter block: its share of the update, by gradient values (under `--schedule
    /// priority` each block is updated just before its forward).
    update_of: Vec<Duration>,
    /// Per parameter block (in forward order): backward time from the start of backward until
    /// that block's gradients are written (backward runs the last block first;
    /// [`crate::measure::Profile::backward_written_ms`]).
    backward_until: Vec<Duration>,
    /// The whole backward.
    backward: Duration,
    /// The optimizer update.
    pub update: Duration,
}

impl EmulatedDevice {
    /// Reads a profile file and scales its times by `scale`.
    pub fn load(path: &Path, scale: f64) -> Result<Self, DeviceError> {
        let refused = |problem| DeviceError::Profile {
            path: path.to_path_buf(),
            problem,
        };
        if !(scale > 0.0 && scale.is_finite() && scale <= 1e6) {
            return Err(DeviceError::Scale(scale));
        }
        // A profile is a few KB: input.rs refuses devices, fifos and files over the cap.
        let text = crate::input::read_text(path, crate::input::FileKind::Profile)?;
        let p: Profile =
            serde_json::from_str(&text).map_err(|e| refused(ProfileProblem::NotAProfile(e)))?;
        // The profile's own numbers first, by the rules every profile reader applies (blocks,
        // times, parts of backward); then the device's: scaled, each time within an hour.
        crate::measure::profile::validate(&p)
            .map_err(|e| refused(ProfileProblem::Unphysical(e)))?;
        let ms = |ms: f64, what: &'static str| {
            let s = ms * scale / 1e3;
            if !(0.0..MAX_STEP_S).contains(&s) {
                return Err(refused(ProfileProblem::Time { what, ms, scale }));
            }
            Ok(Duration::from_secs_f64(s))
        };
        let forward_of = p
            .blocks
            .iter()
            .map(|b| ms(b.forward_ms, "a block's forward"))
            .collect::<Result<Vec<_>, _>>()?;
        let forward: Duration = forward_of.iter().sum();
        let mut backward = Duration::ZERO;
        for b in &p.blocks {
            // A block's input-gradient part is within its backward (`validate`).
            backward += ms(b.backward_ms, "a block's backward")?;
        }
        // Sums of checked times (the whole step is capped below).
        let backward_until = p
            .backward_written_ms()
            .into_iter()
            .map(|t| Duration::from_secs_f64((t * scale / 1e3).max(0.0)))
            .collect();
        let update = ms(p.update_ms, "the update")?;
        let values = |b: &crate::measure::BlockProfile| -> f64 {
            b.param_sizes.iter().map(|&n| n as f64).sum()
        };
        let total: f64 = p.blocks.iter().map(values).sum();
        let update_of = p
            .blocks
            .iter()
            .map(|b| match total > 0.0 {
                true => update.mul_f64(values(b) / total),
                false => Duration::ZERO,
            })
            .collect();
        // The cap is per step, not per block: each block under an hour still let a profile of
        // many blocks hold every step for days.
        let step = forward + backward + update;
        if step.as_secs_f64() >= MAX_STEP_S {
            return Err(refused(ProfileProblem::StepTime {
                seconds: step.as_secs_f64(),
                scale,
            }));
        }
        Ok(Self {
            path: path.to_path_buf(),
            scale,
            model: p.model,
            batch: p.batch,
            forward,
            forward_of,
            update_of,
            backward_until,
            backward,
            update,
        })
    }

    /// Refuses a profile that is not of this run's model, per-worker batch and blocks.
    pub fn check_fits(&self, model: &str, batch: usize, blocks: usize) -> Result<(), DeviceError> {
        let misfit = |problem| DeviceError::Profile {
            path: self.path.clone(),
            problem,
        };
        if self.model != model {
            return Err(misfit(ProfileProblem::OtherModel {
                profile: self.model.clone(),
                run: model.to_string(),
            }));
        }
        if self.batch != batch {
            return Err(misfit(ProfileProblem::OtherBatch {
                profile: self.batch,
                run: batch,
            }));
        }
        if self.backward_until.len() != blocks {
            return Err(misfit(ProfileProblem::OtherBlocks {
                profile: self.backward_until.len(),
                model: blocks,
            }));
        }
        Ok(())
    }

    /// The whole backward.
    pub fn backward(&self) -> Duration {
        self.backward
    }

    /// Waits until `since + time` (returns at once if that has passed).
    pub fn hold(since: Instant, time: Duration) {
        crate::comm::transport::sleep_until(since + time);
    }

    /// The device's forward from `start`, paced block by block around the forward's gates
    /// ([`PacedForward`]); `updates`: each block's share of the update runs at its gate
    /// (`--schedule priority`).
    pub fn paced_forward(&self, start: Instant, updates: bool) -> PacedForward<'_> {
        PacedForward {
            device: self,
            clock: start,
            next: 0,
            updates,
            updated: 0,
        }
    }

    /// `sink` with each block's `block_written` held until the device's backward reaches it,
    /// for a backward that started at `start`.
    pub fn paced<'a>(&'a self, sink: &'a mut dyn GradSink, start: Instant) -> PacedSink<'a> {
        PacedSink {
            sink,
            device: self,
            start,
        }
    }
}

/// Longest step an emulated device may hold a worker to, seconds. Every worker of the run
/// waits for the slowest step (the collectives join them), so a step of hours is a run that
/// looks hung and is never what a profile of a real device means: an hour is far past any
/// real step and still says the time was typed wrong.
const MAX_STEP_S: f64 = 3600.0;

/// Why an emulated device was refused.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// `--emulate-device-scale` out of range.
    #[error(
        "--emulate-device-scale must be a positive number up to 1e6, not {}",
        crate::terminal::number(*.0)
    )]
    Scale(f64),
    /// The profile given with `--emulate-device`.
    #[error("--emulate-device {}: {problem}", .path.display())]
    Profile {
        /// The profile file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        problem: ProfileProblem,
    },
    /// The profile file cannot be read, or is not a regular file of a profile's size.
    #[error("--emulate-device: {0}")]
    Read(#[from] crate::input::InputError),
}

/// What is wrong with an emulated device's profile.
#[derive(Debug, thiserror::Error)]
pub enum ProfileProblem {
    /// It is not a profile's JSON.
    #[error(
        "not a profile ({0}); write one with `dptrain profile --model M --batch B --out FILE`"
    )]
    NotAProfile(serde_json::Error),
    /// A time that, scaled, is not 0 to an hour.
    #[error("{what} of {ms} ms (x {scale}) is not a time from 0 to an hour")]
    Time {
        /// Which phase.
        what: &'static str,
        /// The profile's time.
        ms: f64,
        /// The scale applied.
        scale: f64,
    },
    /// The whole step (forward, backward, update), scaled, is an hour or more.
    #[error(
        "its step (forward, backward and update) is {seconds:.0} s with x {scale}: an emulated \
         step must be under an hour; lower --emulate-device-scale or profile again"
    )]
    StepTime {
        /// The step's time, seconds.
        seconds: f64,
        /// The scale applied.
        scale: f64,
    },
    /// A number no profile may hold (`crate::measure::profile::validate`).
    #[error("{0}")]
    Unphysical(crate::measure::profile::Unphysical),
    /// It is of another model than the run's.
    #[error("the profile is of {profile}, this run trains {run}: profile {run}")]
    OtherModel {
        /// The profile's model.
        profile: String,
        /// The run's model.
        run: String,
    },
    /// Its times are for another per-worker batch.
    #[error(
        "the profile's times are for a per-worker batch of {profile}, this run's is {run}: \
         profile at --batch {run}"
    )]
    OtherBatch {
        /// The profile's per-worker batch.
        profile: usize,
        /// The run's.
        run: usize,
    },
    /// It has another number of blocks than the model.
    #[error("the profile has {profile} blocks, the model {model}: profile this model again")]
    OtherBlocks {
        /// The profile's blocks.
        profile: usize,
        /// The model's parameter blocks.
        model: usize,
    },
}

/// The device's forward, block by block: before block `b` runs ([`PacedForward::reach`]) the
/// device has run every block before it; a gate that waits (priority scheduling's wait for the
/// block's bucket) holds the device until the wait ended ([`PacedForward::gated`]), and under
/// priority the device then updates that block. So a forward that waits for its first layer's
/// weights ends that much later, as on a device, and not at `start` plus the forward's time
/// whatever it waited (which would hide every wait that ends before the device's forward
/// would have). The same timeline as the simulator's gated forward
/// (`sim::step::PlannedStep::gated_step`).
pub struct PacedForward<'a> {
    device: &'a EmulatedDevice,
    /// Where the device is: the forward of blocks before `next` (and their updates) done.
    clock: Instant,
    next: usize,
    updates: bool,
    /// Blocks before this one have had their update.
    updated: usize,
}

impl PacedForward<'_> {
    /// Before block `b`'s gate: waits until the device has run the forward of every block
    /// before `b`.
    pub fn reach(&mut self, b: usize) {
        self.advance_to(b);
        crate::comm::transport::sleep_until(self.clock);
    }

    /// After block `b`'s gate: under priority its weights were reduced at `arrived`, and the
    /// device, if it got there first, waits until then; it then updates `b`. Only the weights
    /// move the device: real compute that ran late (it shares the cores) does not, as with
    /// the whole forward's hold.
    pub fn gated(&mut self, b: usize, arrived: Option<Instant>) {
        if let Some(t) = arrived {
            self.clock = self.clock.max(t);
        }
        if self.updates && b >= self.updated && b < self.device.update_of.len() {
            self.clock += self.device.update_of[b];
            self.updated = b + 1;
        }
    }

    /// The forward's end: waits until the device has run every block.
    pub fn finish(mut self) {
        self.advance_to(self.device.forward_of.len());
        crate::comm::transport::sleep_until(self.clock);
    }

    /// Runs the device's forward of the blocks from `next` up to `b` (excluded). Blocks run
    /// in order; a block gated twice (two layers sharing it) runs once.
    fn advance_to(&mut self, b: usize) {
        let end = b.min(self.device.forward_of.len());
        for k in self.next..end {
            self.clock += self.device.forward_of[k];
        }
        self.next = self.next.max(end);
    }
}

/// A gradient sink whose blocks are handed on when the emulated device would have written them
/// ([`EmulatedDevice::paced`]).
pub struct PacedSink<'a> {
    sink: &'a mut dyn GradSink,
    device: &'a EmulatedDevice,
    start: Instant,
}

impl GradSink for PacedSink<'_> {
    fn block_grads(&mut self, block: usize) -> &mut [f32] {
        self.sink.block_grads(block)
    }

    fn block_written(&mut self, block: usize) -> Result<(), String> {
        if let Some(&until) = self.device.backward_until.get(block) {
            EmulatedDevice::hold(self.start, until);
        }
        self.sink.block_written(block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> std::path::PathBuf {
        let p = dir.join("p.json");
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn a_profile_becomes_scaled_phase_times_and_cumulative_block_deadlines() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            r#"{"model":"lenet5","source":"x","batch":8,"input":[1,28,28],"update_ms":1.0,
               "blocks":[{"name":"a","forward_ms":1.0,"backward_ms":2.0,"param_sizes":[4],"macs_per_sample":1},
                         {"name":"b","forward_ms":3.0,"backward_ms":5.0,"param_sizes":[4],"macs_per_sample":1}]}"#,
        );
        let d = EmulatedDevice::load(&p, 2.0).unwrap();
        assert_eq!(d.forward, Duration::from_millis(8));
        // Backward runs block b first: b is written at 2 x 5 ms, a at 2 x (5 + 2) ms.
        assert_eq!(
            d.backward_until,
            vec![Duration::from_millis(14), Duration::from_millis(10)]
        );
        assert_eq!(d.backward(), Duration::from_millis(14));
        assert_eq!(d.update, Duration::from_millis(2));
        assert!(d.check_fits("lenet5", 8, 2).is_ok());
        let e = d.check_fits("lenet5", 16, 2).unwrap_err().to_string();
        assert!(e.contains("batch of 8") && e.contains("16"), "{e}");
        assert!(d
            .check_fits("vgg-small", 8, 2)
            .unwrap_err()
            .to_string()
            .contains("vgg-small"));
        let e = d.check_fits("lenet5", 8, 3).unwrap_err().to_string();
        assert!(e.contains("2 blocks, the model 3"), "{e}");
    }

    #[test]
    fn a_block_is_written_before_its_input_gradient_and_no_part_exceeds_the_whole() {
        let dir = tempfile::tempdir().unwrap();
        let profile = |input_grad: f64| {
            format!(
                r#"{{"model":"m","source":"x","batch":8,"input":[1,28,28],"update_ms":1.0,
                   "blocks":[{{"name":"a","forward_ms":1.0,"backward_ms":2.0,"param_sizes":[4],"macs_per_sample":1}},
                             {{"name":"b","forward_ms":1.0,"backward_ms":5.0,"input_grad_ms":{input_grad},"param_sizes":[4],"macs_per_sample":1}}]}}"#
            )
        };
        let p = write(dir.path(), &profile(3.0));
        let d = EmulatedDevice::load(&p, 1.0).unwrap();
        // b's block is written after its 2 ms of parameter gradient; a's at the end.
        let ms = Duration::from_millis;
        assert_eq!(d.backward_until, vec![ms(7), ms(2)]);
        assert_eq!(d.backward(), ms(7));
        let p = write(dir.path(), &profile(6.0));
        let e = EmulatedDevice::load(&p, 1.0).unwrap_err().to_string();
        assert!(e.contains("'b'") && e.contains("input_grad_ms"), "{e}");
    }

    #[test]
    fn a_paced_forward_waits_for_late_weights_and_only_for_them() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            r#"{"model":"m","source":"x","batch":8,"input":[1,28,28],"update_ms":4.0,
               "blocks":[{"name":"a","forward_ms":1.0,"backward_ms":1.0,"param_sizes":[4],"macs_per_sample":1},
                         {"name":"b","forward_ms":3.0,"backward_ms":1.0,"param_sizes":[12],"macs_per_sample":1}]}"#,
        );
        let d = EmulatedDevice::load(&p, 10.0).unwrap();
        let ms = Duration::from_millis;
        // The update's 40 ms split by values: 4 of 16, 12 of 16.
        assert_eq!(d.update_of, vec![ms(10), ms(30)]);
        // A start a second ago: every deadline below has passed, so nothing sleeps, and the
        // real time (later than all of them) is the "late real compute" that must not count.
        let start = Instant::now() - Duration::from_secs(1);
        let mut f = d.paced_forward(start, true);
        f.reach(0);
        assert_eq!(f.clock, start);
        // Block a's weights came back 50 ms in: the device waits for them, then updates a.
        f.gated(0, Some(start + ms(50)));
        assert_eq!(f.clock, start + ms(60));
        f.reach(1);
        assert_eq!(f.clock, start + ms(70));
        // Block b's came back before the device got there: no wait, only its update; a second
        // gate of the same block (a shared layer) updates nothing more.
        f.gated(1, Some(start + ms(5)));
        f.gated(1, Some(start + ms(5)));
        assert_eq!(f.clock, start + ms(100));
        f.advance_to(2);
        assert_eq!(f.clock, start + ms(130));
        // Without priority no block is updated in the forward and nothing is waited for: the
        // forward is the profile's, 40 ms, however late the real compute ran.
        let mut f = d.paced_forward(start, false);
        for b in 0..2 {
            f.reach(b);
            f.gated(b, None);
        }
        f.advance_to(2);
        assert_eq!(f.clock, start + d.forward);
        assert_eq!(d.forward, ms(40));
    }

    #[test]
    fn bad_files_and_scales_are_refused_with_the_cause() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "{\"model\": 1}");
        let e = EmulatedDevice::load(&p, 1.0).unwrap_err().to_string();
        assert!(
            e.contains("not a profile") && e.contains("dptrain profile"),
            "{e}"
        );
        let e = EmulatedDevice::load(&dir.path().join("none.json"), 1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("none.json"), "{e}");
        let ok = write(
            dir.path(),
            r#"{"model":"m","source":"x","batch":1,"input":[1,2,2],"update_ms":-1.0,
               "blocks":[{"name":"a","forward_ms":1.0,"backward_ms":1.0,"param_sizes":[1],"macs_per_sample":1}]}"#,
        );
        assert!(matches!(
            EmulatedDevice::load(&ok, 1.0),
            Err(DeviceError::Profile {
                problem: ProfileProblem::Unphysical(_),
                ..
            })
        ));
        // A physical time that the scale takes past the hour.
        let slow = write(
            dir.path(),
            r#"{"model":"m","source":"x","batch":1,"input":[1,2,2],"update_ms":10.0,
               "blocks":[{"name":"a","forward_ms":1.0,"backward_ms":1.0,"param_sizes":[1],"macs_per_sample":1}]}"#,
        );
        assert!(matches!(
            EmulatedDevice::load(&slow, 1e6),
            Err(DeviceError::Profile {
                problem: ProfileProblem::Time {
                    what: "the update",
                    ..
                },
                ..
            })
        ));
        for s in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                EmulatedDevice::load(&ok, s),
                Err(DeviceError::Scale(_))
            ));
        }
    }

    #[test]
    fn the_hour_caps_the_whole_step_not_each_block() {
        let dir = tempfile::tempdir().unwrap();
        // Two blocks of 40 minutes each: each under the hour, the step not.
        let p = write(
            dir.path(),
            r#"{"model":"m","source":"x","batch":1,"input":[1,2,2],"update_ms":0.0,
               "blocks":[{"name":"a","forward_ms":2400000.0,"backward_ms":0.0,"param_sizes":[1],"macs_per_sample":1},
                         {"name":"b","forward_ms":2400000.0,"backward_ms":0.0,"param_sizes":[1],"macs_per_sample":1}]}"#,
        );
        let e = EmulatedDevice::load(&p, 1.0).unwrap_err();
        assert!(
            matches!(
                e,
                DeviceError::Profile {
                    problem: ProfileProblem::StepTime { .. },
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("4800 s"), "{e}");
        assert!(EmulatedDevice::load(&p, 0.8).is_err());
        assert!(EmulatedDevice::load(&p, 0.7).is_ok());
    }

    #[test]
    fn hold_waits_until_the_deadline_and_no_longer_once_it_has_passed() {
        let t = Instant::now();
        EmulatedDevice::hold(t, Duration::from_millis(20));
        assert!(t.elapsed() >= Duration::from_millis(20));
        let late = Instant::now();
        EmulatedDevice::hold(t, Duration::from_millis(1));
        assert!(late.elapsed() < Duration::from_millis(5));
    }
}
