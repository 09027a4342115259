//! A log-normal law of job lengths and its Gittins index, for `learned` and
//! the history that fits it: a leaf module, so that the history store and the
//! policies share the law without importing each other.
//!
//! A job's length S (device seconds) is log-normal: ln S ~ N(mu, sigma^2).
//! For a job that has done `a` of work, its Gittins index is
//!
//! ```text
//!   G(a) = max over x > a of  (F(x) - F(a)) / (M(x) - M(a))
//! ```
//!
//! with F the law's distribution function and M(x) = E[min(S, x)], in closed
//! form through the normal tail Q: F = 1 - Q(z), and
//! M(x) = e^(mu + sigma^2/2) (1 - Q(z - sigma)) + x Q(z), z = (ln x - mu) / sigma.
//! Differences are taken between tails (Q(z_a) - Q(z_x)), which keeps their
//! precision for jobs far past their median. The maximum is found on a grid of
//! end points spaced evenly in z; the index is smooth in x, so a grid of
//! [`GRID_POINTS`] is within a fraction of a percent of the true maximum.

/// A law's spread is kept within these bounds: below, a law is a point and
/// one noisy run would reorder jobs wildly; above, it says nothing.
pub const MIN_SIGMA: f64 = 0.05;
pub const MAX_SIGMA: f64 = 3.0;

/// End points tried per index.
pub const GRID_POINTS: usize = 96;

/// The grid reaches this many standard deviations above the median (or above
/// the job's own work, if that is further): beyond it, less than 1e-9 of the
/// law is left.
const GRID_REACH: f64 = 6.0;

/// A log-normal law of a job's length, in nanoseconds of work.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogNormal {
    /// ln of the median length in nanoseconds.
    pub mu: f64,
    /// Standard deviation of ln(length); > 0.
    pub sigma: f64,
}

impl LogNormal {
    /// The law with this median (ns) and spread; None unless both are
    /// positive and finite.
    pub fn new(median_ns: f64, sigma: f64) -> Option<LogNormal> {
        (median_ns > 0.0 && median_ns.is_finite() && sigma > 0.0 && sigma.is_finite()).then(|| {
            LogNormal {
                mu: median_ns.ln(),
                sigma,
            }
        })
    }

    pub fn median_ns(&self) -> f64 {
        self.mu.exp()
    }

    fn z(&self, x: f64) -> f64 {
        if x <= 0.0 {
            f64::NEG_INFINITY
        } else {
            (x.ln() - self.mu) / self.sigma
        }
    }

    /// P(S > x).
    pub fn survival(&self, x: f64) -> f64 {
        normal_tail(self.z(x))
    }

    /// E[min(S, x)] - E[min(S, t)] for t <= x: the expected work a job of
    /// this law does between t and x (0 where it ended before t).
    pub fn served_between(&self, t: f64, x: f64) -> f64 {
        let (z_t, z_x) = (self.z(t), self.z(x));
        let mean = (self.mu + self.sigma * self.sigma / 2.0).exp();
        let t_part = if t > 0.0 { t * normal_tail(z_t) } else { 0.0 };
        (mean * (normal_tail(z_t - self.sigma) - normal_tail(z_x - self.sigma)) + x * normal_tail(z_x)
            - t_part)
            .max(0.0)
    }

    /// The length below which a share `p` (0 < p < 1) of this law lies.
    pub fn quantile(&self, p: f64) -> f64 {
        // Bisection on z: Q is monotone, and 60 halvings of [-10, 10] are
        // far below the float's precision in the length.
        let (mut lo, mut hi) = (-10.0f64, 10.0f64);
        for _ in 0..60 {
            let mid = (lo + hi) / 2.0;
            if 1.0 - normal_tail(mid) < p {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (self.mu + self.sigma * (lo + hi) / 2.0).exp()
    }

    /// The median remaining length of a job of this law that has done `a`.
    pub fn median_remaining(&self, a: f64) -> f64 {
        let left = self.survival(a.max(0.0));
        if left <= 0.0 {
            return 0.0;
        }
        (self.quantile(1.0 - left / 2.0) - a).max(0.0)
    }

    /// The law fitted to ln(length)s by their mean and spread (the spread
    /// kept within [`MIN_SIGMA`]..[`MAX_SIGMA`]); None for fewer than two.
    pub fn fit_logs(logs: impl Iterator<Item = f64>) -> Option<LogNormal> {
        let (mut n, mut sum, mut sum_sq) = (0usize, 0.0, 0.0);
        for l in logs {
            n += 1;
            sum += l;
            sum_sq += l * l;
        }
        if n < 2 {
            return None;
        }
        let mean = sum / n as f64;
        let var = (sum_sq / n as f64 - mean * mean).max(0.0);
        LogNormal::new(mean.exp(), var.sqrt().clamp(MIN_SIGMA, MAX_SIGMA))
    }

    /// The Gittins index of a job that has done `attained` ns of work, in
    /// finishes per ns (higher runs first).
    pub fn gittins_index(&self, attained: f64) -> f64 {
        let a = attained.max(0.0);
        let z_a = self.z(a);
        let tail_a = normal_tail(z_a);
        let shifted_a = normal_tail(z_a - self.sigma);
        // e^(mu + sigma^2 / 2): the mean.
        let mean = (self.mu + self.sigma * self.sigma / 2.0).exp();
        let start = if z_a.is_finite() { z_a } else { -GRID_REACH };
        let end = start.max(0.0) + GRID_REACH;
        let step = (end - start) / GRID_POINTS as f64;
        let mut best = 0.0f64;
        for k in 1..=GRID_POINTS {
            let z_x = start + step * k as f64;
            let x = (self.mu + self.sigma * z_x).exp();
            let tail_x = normal_tail(z_x);
            let finished = tail_a - tail_x;
            // M(x) - M(a): the expected work until x, of jobs past a.
            let served =
                mean * (shifted_a - normal_tail(z_x - self.sigma)) + x * tail_x - a * tail_a;
            if finished > 0.0 && served > 0.0 {
                best = best.max(finished / served);
            }
        }
        if best > 0.0 {
            return best;
        }
        // So far in the tail that both differences vanish: the hazard rate
        // there, by the normal's Mills ratio (z / (sigma a)).
        z_a.max(1.0) / (self.sigma * a.max(1.0))
    }
}

/// The index of every law of one spread, tabulated: scaling a length by c
/// scales the index by 1/c, so the index of ln-median mu at work a is
/// e^-mu g((ln a - mu) / sigma) for one function g per sigma. `learned`
/// re-keys a job at every iteration boundary; a table lookup there instead
/// of a fresh maximisation makes it as cheap as `gittins`.
pub struct IndexTable {
    sigma: f64,
    /// g at work 0.
    at_zero: f64,
    /// Where the table starts, in z.
    z_min: f64,
    /// g at z = z_min + k TABLE_Z_STEP.
    values: Vec<f64>,
}

/// The table starts where the work is below both this share of the median
/// and 8 standard deviations under it: below, the index is that at work 0
/// within a fraction of a percent. Above [`TABLE_Z_MAX`] it is computed
/// afresh (rare: a job 10 sigma past its median).
const TABLE_BELOW_MEDIAN: f64 = 1e-3;
const TABLE_Z_MAX: f64 = 10.0;
const TABLE_Z_STEP: f64 = 0.02;

impl IndexTable {
    /// The table for laws of spread `sigma` (> 0; a few thousand points, a
    /// few ms to build for the narrowest).
    pub fn new(sigma: f64) -> IndexTable {
        let unit = LogNormal { mu: 0.0, sigma };
        let z_min = (-8.0f64).min(TABLE_BELOW_MEDIAN.ln() / sigma);
        let points = ((TABLE_Z_MAX - z_min) / TABLE_Z_STEP).round() as usize + 1;
        let values = (0..points)
            .map(|k| {
                let z = z_min + k as f64 * TABLE_Z_STEP;
                unit.gittins_index((sigma * z).exp())
            })
            .collect();
        IndexTable {
            sigma,
            at_zero: unit.gittins_index(0.0),
            z_min,
            values,
        }
    }

    /// [`LogNormal::gittins_index`] of a law of median `median_ns` and this
    /// table's spread, by linear interpolation.
    pub fn index(&self, median_ns: f64, attained: f64) -> f64 {
        let law = LogNormal {
            mu: median_ns.ln(),
            sigma: self.sigma,
        };
        let scale = (-law.mu).exp();
        if attained <= 0.0 {
            return self.at_zero * scale;
        }
        let z = law.z(attained);
        if z < self.z_min {
            return self.at_zero * scale;
        }
        let at = (z - self.z_min) / TABLE_Z_STEP;
        let k = at.floor() as usize;
        if k + 1 >= self.values.len() {
            return law.gittins_index(attained);
        }
        let frac = at - k as f64;
        (self.values[k] * (1.0 - frac) + self.values[k + 1] * frac) * scale
    }
}

/// Q(z) = P(N(0,1) > z).
pub fn normal_tail(z: f64) -> f64 {
    if z == f64::INFINITY {
        return 0.0;
    }
    if z == f64::NEG_INFINITY {
        return 1.0;
    }
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// The complementary error function, with relative error below 1.2e-7
/// everywhere (Chebyshev fit, Numerical Recipes' `erfcc`), tails included.
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_normal_tail_matches_known_values() {
        for (z, q) in [
            (0.0, 0.5),
            (1.0, 0.158_655_25),
            (-1.96, 0.975_002_1),
            (3.0, 0.001_349_898),
            (8.0, 6.220_96e-16),
        ] {
            let got = normal_tail(z);
            assert!(((got - q) / q).abs() < 1e-6, "Q({z}) = {got}, not {q}");
        }
    }

    #[test]
    fn a_narrow_law_indexes_like_a_known_length() {
        // Nearly deterministic: a new job's index is about 1 / its length.
        let law = LogNormal::new(100.0, 0.01).unwrap();
        let index = law.gittins_index(0.0);
        assert!((index * 100.0 - 1.0).abs() < 0.02, "{index}");
        // Half done: about 1 / the 50 left.
        assert!((law.gittins_index(50.0) * 50.0 - 1.0).abs() < 0.05);
    }

    #[test]
    fn shorter_laws_rank_ahead_and_a_job_that_overruns_falls_back() {
        let short = LogNormal::new(60.0, 0.5).unwrap();
        let long = LogNormal::new(600.0, 0.5).unwrap();
        assert!(short.gittins_index(0.0) > long.gittins_index(0.0));
        // Scale invariance: 10x longer, 10x smaller index.
        let ratio = short.gittins_index(0.0) / long.gittins_index(0.0);
        assert!((ratio - 10.0).abs() < 0.1, "{ratio}");
        // Close to its median the job is promised its end and rises...
        assert!(short.gittins_index(50.0) > short.gittins_index(0.0));
        // ...far past it (a surprise) the spread says little is known and it falls.
        assert!(short.gittins_index(2_000.0) < short.gittins_index(0.0));
        let far = short.gittins_index(1e12);
        assert!(far.is_finite() && far > 0.0);
    }

    #[test]
    fn the_table_matches_the_direct_index() {
        for sigma in [0.1, 0.5, 1.6] {
            let table = IndexTable::new(sigma);
            for median in [1e9, 6e11] {
                let law = LogNormal::new(median, sigma).unwrap();
                for a in [
                    0.0,
                    median * 1e-5,
                    median * 0.3,
                    median,
                    median * 4.0,
                    median * 1e3,
                ] {
                    let (direct, tabled) = (law.gittins_index(a), table.index(median, a));
                    assert!(
                        ((tabled - direct) / direct).abs() < 0.01,
                        "sigma {sigma} median {median} a {a}: {tabled} vs {direct}"
                    );
                }
            }
        }
    }

    #[test]
    fn rejects_meaningless_parameters() {
        assert!(LogNormal::new(0.0, 1.0).is_none());
        assert!(LogNormal::new(1.0, 0.0).is_none());
        assert!(LogNormal::new(f64::NAN, 1.0).is_none());
    }
}
