//! Power of two choices over peak-EWMA cost, as linkerd2-proxy balances (and tower's
//! `balance::p2c` + `load::PeakEwma`): the industry baseline that knows no SLO.
//!
//! Each endpoint's cost is `rtt × (in-flight + 1)`, where `rtt` is a peak-sensitive
//! exponentially weighted moving average of its response times: a sample above the
//! average replaces it at once (peaks are believed immediately), smaller samples are
//! blended in with weight `1 − e^(−Δt/τ)`, and the estimate decays towards zero while no
//! sample arrives, so an idle endpoint is tried again (τ = 10 s, linkerd's default). An
//! endpoint that was never measured costs `p2c-ewma-default-rtt` (default 30 ms). Two
//! distinct candidates are drawn at random; the cheaper one takes the request. Failed
//! requests count as a 1 s sample.

use std::time::Duration;

use rand::RngCore;

use super::params::Params;
use super::{two_choices, two_distinct, Choice, PickContext, Reason, Strategy};
use crate::settings::{ServiceSettings, SettingError};

/// P2C over peak-EWMA cost (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct P2cEwma {
    /// Cost of an endpoint that was never measured (`p2c-ewma-default-rtt`, default 30 ms).
    pub default_rtt: Duration,
}

impl P2cEwma {
    /// From `p2c-ewma-default-rtt`.
    pub fn build(settings: &ServiceSettings) -> (Box<dyn Strategy>, Vec<SettingError>) {
        let mut p = Params::new(settings, "p2c-ewma");
        let default_rtt = p
            .duration("default-rtt", Some(Duration::from_millis(30)))
            .unwrap_or(Duration::from_millis(30));
        (Box::new(P2cEwma { default_rtt }), p.errors)
    }

    fn cost(&self, ctx: &PickContext<'_>, i: usize) -> f64 {
        let state = ctx.route.state(i);
        let rtt = state
            .peak_ewma(ctx.now)
            .unwrap_or(self.default_rtt)
            .as_secs_f64();
        rtt * f64::from(state.in_flight() + 1)
    }
}

impl Strategy for P2cEwma {
    fn name(&self) -> &'static str {
        "p2c-ewma"
    }

    fn pick(&self, ctx: &PickContext<'_>, rng: &mut dyn RngCore) -> Option<Choice> {
        let cheaper = |a: usize, b: usize| {
            if self.cost(ctx, b) < self.cost(ctx, a) {
                b
            } else {
                a
            }
        };
        let index = two_choices(ctx, ctx.route.eligible(), rng, cheaper).or_else(|| {
            // Most endpoints are excluded or cooling down: two distinct ones of the rest.
            let usable: Vec<usize> = ctx.candidates().collect();
            match usable.len() {
                0 => None,
                1 => Some(usable[0]),
                n => {
                    let (a, b) = two_distinct(n, rng);
                    Some(cheaper(usable[a], usable[b]))
                }
            }
        })?;
        Some(Choice {
            index,
            reason: Reason::Strategy,
        })
    }
}
