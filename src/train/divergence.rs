//! The divergence guard beside the non-finite one: a loss that stays
//! finite but grows far past where training started (a learning rate of
//! 1e10 gives losses of 1e19 and an AUC of 0.5) is a diverged model that
//! would otherwise be saved and exported silently.
//!
//! The rule (docs/operations.md): the baseline is the loss of the run's
//! first trained step (the model as it started), floored at 1; the loss is
//! followed by an exponential moving average (weight `SMOOTHING`); when the
//! average exceeds `factor` times the baseline the run is diverging: a
//! warning names the step and both values (once, and again each time the
//! average grows another `factor` times), and with `stop` training ends
//! there with `Diverged` (exit 1) before the step is saved.

use super::step::Diverged;

/// The moving average's weight of a new loss.
pub const SMOOTHING: f64 = 0.1;
/// The default of `--divergence_factor`.
pub const DEFAULT_FACTOR: f64 = 100.0;

/// What `--divergence_factor` and `--stop_on_divergence` ask.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DivergencePolicy {
    /// How many times the baseline the averaged loss may reach; 0 turns
    /// the guard off.
    pub factor: f64,
    /// Stop (exit 1) instead of warning.
    pub stop: bool,
}

impl Default for DivergencePolicy {
    fn default() -> Self {
        DivergencePolicy {
            factor: DEFAULT_FACTOR,
            stop: false,
        }
    }
}

/// The guard's state over one run.
#[derive(Debug, Clone)]
pub struct DivergenceGuard {
    policy: DivergencePolicy,
    baseline: Option<f64>,
    average: Option<f64>,
    /// The bound of the next warning (grows by `factor` after each).
    next_warning: Option<f64>,
}

impl DivergenceGuard {
    pub fn new(policy: DivergencePolicy) -> Self {
        DivergenceGuard {
            policy,
            baseline: None,
            average: None,
            next_warning: None,
        }
    }

    /// Whether a warning was given (the run diverged at some point).
    pub fn warned(&self) -> bool {
        self.baseline
            .zip(self.next_warning)
            .is_some_and(|(b, n)| n > b * self.policy.factor)
    }

    /// Follows the (finite) loss of trained step `step`.
    pub fn observe(&mut self, step: u64, loss: f32) -> Result<(), Diverged> {
        if self.policy.factor <= 0.0 || !loss.is_finite() {
            return Ok(());
        }
        let loss = f64::from(loss).abs();
        self.average = Some(self.average.map_or(loss, |a| a + SMOOTHING * (loss - a)));
        let Some(baseline) = self.baseline else {
            let b = loss.max(1.0);
            self.baseline = Some(b);
            self.next_warning = Some(b * self.policy.factor);
            return Ok(());
        };
        let (Some(average), Some(bound)) = (self.average, self.next_warning) else {
            return Ok(());
        };
        if average <= bound {
            return Ok(());
        }
        let what = format!(
            "the loss (averaged) grew to {average:.4e}, over {} times its first step's {baseline:.4} (floored at 1): \
             the model is diverging",
            self.policy.factor
        );
        if self.policy.stop {
            return Err(Diverged { step, what });
        }
        log::warn!(
            "step {step}: {what} (lower the learning rate or check the input data; \
             --stop_on_divergence stops here instead)"
        );
        self.next_warning = Some(bound * self.policy.factor);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_loss_passes_and_an_exploding_one_warns_or_stops() {
        let mut steady = DivergenceGuard::new(DivergencePolicy::default());
        for s in 0..500 {
            steady.observe(s, 0.69 - s as f32 * 1e-4).unwrap();
        }
        assert!(!steady.warned());
        let mut warn = DivergenceGuard::new(DivergencePolicy::default());
        let mut stop = DivergenceGuard::new(DivergencePolicy {
            stop: true,
            ..Default::default()
        });
        let mut stopped_at = None;
        for s in 0..100u64 {
            let loss = if s < 30 { 0.7 } else { 5e19 };
            warn.observe(s, loss).unwrap();
            if let Err(d) = stop.observe(s, loss) {
                stopped_at = Some(d.step);
                break;
            }
        }
        assert!(warn.warned());
        assert_eq!(stopped_at, Some(30));
        // Turned off.
        let mut off = DivergenceGuard::new(DivergencePolicy {
            factor: 0.0,
            stop: true,
        });
        for s in 0..100 {
            off.observe(s, if s < 30 { 0.7 } else { 5e19 }).unwrap();
        }
    }
}
