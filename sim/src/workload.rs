//! The workload table: per model, what one job of it costs.
//!
//! CSV columns: `model,iteration_s,persistent_mb,ephemeral_mb,utilization,startup_s`
//! - `iteration_s`: one iteration alone on the device, seconds;
//! - `persistent_mb`, `ephemeral_mb`: memory for the job's life / during an
//!   iteration, MiB (Salus's P and E);
//! - `utilization` (0, 1]: the share of the device an iteration keeps busy (see
//!   [`crate::engine`] for how it is used); optional, default 1;
//! - `startup_s`: time from a job's arrival to its first iteration during which
//!   it does not use the device (session creation, warm-up); optional, default 0.
//!
//! [`derive_from_salus`] builds the table from the original Salus measurements
//! (`shared/data/salus_workloads.csv`); its assumptions are written there.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::{csv, SimError};

pub const MIB: f64 = (1u64 << 20) as f64;

#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub model: String,
    pub iteration_s: f64,
    pub persistent_bytes: u64,
    pub ephemeral_bytes: u64,
    pub utilization: f64,
    pub startup_s: f64,
}

/// Workloads by model name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadTable {
    pub models: BTreeMap<String, Workload>,
}

impl WorkloadTable {
    pub fn parse(text: &str) -> Result<WorkloadTable, SimError> {
        let mut models = BTreeMap::new();
        for row in csv::parse(
            text,
            &["model", "iteration_s", "persistent_mb", "ephemeral_mb"],
        )? {
            let model = row.get("model")?.to_string();
            let utilization = row.optional_number("utilization")?.unwrap_or(1.0);
            let iteration_s = row.number("iteration_s")?;
            if !(utilization > 0.0 && utilization <= 1.0) || iteration_s <= 0.0 {
                return Err(SimError::Csv {
                    line: row.line,
                    why: format!(
                        "model {model:?}: utilization must be in (0, 1] and iteration_s > 0"
                    ),
                });
            }
            let workload = Workload {
                model: model.clone(),
                iteration_s,
                persistent_bytes: (row.number("persistent_mb")? * MIB) as u64,
                ephemeral_bytes: (row.number("ephemeral_mb")? * MIB) as u64,
                utilization,
                startup_s: row.optional_number("startup_s")?.unwrap_or(0.0),
            };
            if models.insert(model.clone(), workload).is_some() {
                return Err(SimError::Csv {
                    line: row.line,
                    why: format!("model {model:?} listed twice"),
                });
            }
        }
        Ok(WorkloadTable { models })
    }

    pub fn get(&self, model: &str) -> Result<&Workload, SimError> {
        self.models
            .get(model)
            .ok_or_else(|| SimError::UnknownModel(model.to_string()))
    }

    pub fn to_csv(&self) -> String {
        let mut out =
            String::from("model,iteration_s,persistent_mb,ephemeral_mb,utilization,startup_s\n");
        for w in self.models.values() {
            let _ = writeln!(
                out,
                "{},{:.6},{:.1},{:.1},{:.3},{:.3}",
                w.model,
                w.iteration_s,
                w.persistent_bytes as f64 / MIB,
                w.ephemeral_bytes as f64 / MIB,
                w.utilization,
                w.startup_s
            );
        }
        out
    }
}

/// Parameters in millions, from the models' papers / tf_cnn_benchmarks (not in
/// the data file, which has no persistent memory).
const PARAMS_MILLIONS: &[(&str, f64)] = &[
    ("alexnet", 61.0),
    ("googlenet", 6.8),
    ("inception3", 23.8),
    ("inception4", 42.7),
    ("overfeat", 145.9),
    ("resnet50", 25.6),
    ("resnet101", 44.5),
    ("resnet152", 60.2),
    ("vgg11", 132.9),
    ("vgg16", 138.4),
    ("vgg19", 143.7),
];

struct Measurement {
    model: String,
    batch: f64,
    jct_s: f64,
    iterations: f64,
    peak_mb: f64,
}

/// Builds the table from Salus's published measurements (`config,jct_s,
/// peak_mem_mb,iterations`, one row per `<model>_<batch>_<duration>`):
/// - `iteration_s`, `startup_s`: least-squares line jct = startup + n x t over
///   the runs of one model and batch (1, 5 and 10 minute runs);
/// - persistent: parameters x 4 bytes (tf_cnn_benchmarks' default optimizer,
///   SGD, has no slots); ephemeral: peak - persistent;
/// - utilization: per model, iteration time against batch size fitted as
///   t = a + c x batch; the batch-proportional part c x batch / t is the share
///   of an iteration that keeps the GPU busy, the fixed part a is taken as idle
///   (launches, synchronisation, input). The data has no utilization; this is
///   the model's assumption, clamped to [0.1, 1].
pub fn derive_from_salus(text: &str) -> Result<WorkloadTable, SimError> {
    let mut runs = Vec::new();
    for row in csv::parse(text, &["config", "jct_s", "peak_mem_mb", "iterations"])? {
        let config = row.get("config")?;
        let parts: Vec<&str> = config.rsplitn(3, '_').collect();
        let [_duration, batch, model] = parts[..] else {
            return Err(SimError::Csv {
                line: row.line,
                why: format!("config {config:?} is not <model>_<batch>_<duration>"),
            });
        };
        runs.push(Measurement {
            model: model.to_string(),
            batch: batch.parse().map_err(|_| SimError::Csv {
                line: row.line,
                why: format!("batch {batch:?} in {config:?} is not a number"),
            })?,
            jct_s: row.number("jct_s")?,
            iterations: row.number("iterations")?,
            peak_mb: row.number("peak_mem_mb")?,
        });
    }
    let mut by_config: BTreeMap<(String, u64), Vec<&Measurement>> = BTreeMap::new();
    for run in &runs {
        by_config
            .entry((run.model.clone(), run.batch as u64))
            .or_default()
            .push(run);
    }
    // Per model and batch: iteration time and start-up.
    let mut fitted: BTreeMap<(String, u64), (f64, f64, f64)> = BTreeMap::new();
    for ((model, batch), runs) in &by_config {
        let points: Vec<(f64, f64)> = runs.iter().map(|r| (r.iterations, r.jct_s)).collect();
        let (startup, per_iteration) = match fit_line(&points) {
            Some((a, c)) if c > 0.0 && a >= 0.0 => (a, c),
            // One run, or a fit without meaning: no start-up, mean time per iteration.
            _ => (
                0.0,
                points.iter().map(|(n, t)| t / n).sum::<f64>() / points.len() as f64,
            ),
        };
        let peak = runs.iter().map(|r| r.peak_mb).fold(0.0, f64::max);
        fitted.insert((model.clone(), *batch), (per_iteration, startup, peak));
    }
    let mut models = BTreeMap::new();
    for ((model, batch), &(iteration_s, startup_s, peak_mb)) in &fitted {
        let params = PARAMS_MILLIONS
            .iter()
            .find(|(m, _)| m == model)
            .map(|(_, p)| *p)
            .ok_or_else(|| SimError::UnknownModel(format!("{model} (no parameter count known)")))?;
        let persistent_mb = params * 1e6 * 4.0 / MIB;
        let ephemeral_mb = (peak_mb - persistent_mb).max(peak_mb * 0.1);
        let per_batch: Vec<(f64, f64)> = fitted
            .iter()
            .filter(|((m, _), _)| m == model)
            .map(|((_, b), (t, _, _))| (*b as f64, *t))
            .collect();
        let utilization = match fit_line(&per_batch) {
            Some((fixed, per_sample)) if fixed > 0.0 && per_sample > 0.0 => {
                per_sample * *batch as f64 / (fixed + per_sample * *batch as f64)
            }
            _ => 1.0,
        }
        .clamp(0.1, 1.0);
        let name = format!("{model}_{batch}");
        models.insert(
            name.clone(),
            Workload {
                model: name,
                iteration_s,
                persistent_bytes: (persistent_mb * MIB) as u64,
                ephemeral_bytes: (ephemeral_mb * MIB) as u64,
                utilization,
                startup_s,
            },
        );
    }
    Ok(WorkloadTable { models })
}

/// Least squares y = a + c x; None with fewer than two distinct x.
fn fit_line(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    if points.len() < 2 || sxx <= f64::EPSILON {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let c = sxy / sxx;
    Some((mean_y - c * mean_x, c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_table_and_defaults_optional_columns() {
        let table =
            WorkloadTable::parse("model,iteration_s,persistent_mb,ephemeral_mb\nm,0.5,2,1\n")
                .unwrap();
        let m = table.get("m").unwrap();
        assert_eq!((m.persistent_bytes, m.ephemeral_bytes), (2 << 20, 1 << 20));
        assert_eq!((m.utilization, m.startup_s), (1.0, 0.0));
        assert!(matches!(table.get("x"), Err(SimError::UnknownModel(_))));
        let err = WorkloadTable::parse(
            "model,iteration_s,persistent_mb,ephemeral_mb,utilization\nm,1,1,1,2\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("utilization"), "{err}");
        // Round trip.
        assert_eq!(WorkloadTable::parse(&table.to_csv()).unwrap(), table);
    }

    #[test]
    fn derivation_fits_startup_iteration_time_and_utilization() {
        // resnet50: batch 25 iterations take 0.1 s after 10 s of start-up, batch 50 0.15 s:
        // t = 0.05 + 0.002 b, so utilization at 25 is 0.05 / 0.1 = 0.5, at 50 0.1 / 0.15.
        let text = "config,jct_s,peak_mem_mb,iterations\n\
            resnet50_25_1min,20,1000,100\nresnet50_25_5min,110,1000,1000\n\
            resnet50_50_1min,25,1800,100\nresnet50_50_5min,160,1800,1000\n";
        let table = derive_from_salus(text).unwrap();
        let small = table.get("resnet50_25").unwrap();
        assert!((small.iteration_s - 0.1).abs() < 1e-9 && (small.startup_s - 10.0).abs() < 1e-6);
        assert!(
            (small.utilization - 0.5).abs() < 1e-6,
            "{}",
            small.utilization
        );
        let large = table.get("resnet50_50").unwrap();
        assert!((large.utilization - 0.1 / 0.15).abs() < 1e-6);
        // 25.6M parameters x 4 bytes = 97.66 MiB persistent; the rest of the peak is ephemeral.
        assert!(small.persistent_bytes.abs_diff(102_400_000) <= 1);
        assert!((small.ephemeral_bytes as f64 / MIB - (1000.0 - 25.6e6 * 4.0 / MIB)).abs() < 0.01);
        assert!(derive_from_salus("config,jct_s,peak_mem_mb,iterations\nbogus,1,1,1\n").is_err());
    }
}
