//! A small latency recorder: power-of-two histogram over all samples, and
//! exact percentiles over the most recent ones.

use std::collections::VecDeque;

/// Samples kept for percentiles.
const RECENT: usize = 16_384;
const BUCKETS: usize = 40;

#[derive(Clone, Debug)]
pub struct LatencyRecorder {
    buckets: [u64; BUCKETS],
    count: u64,
    /// Of all samples, for a histogram's `_sum` (saturates after ~584 years).
    sum_ns: u64,
    max_ns: u64,
    recent: VecDeque<u64>,
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        LatencyRecorder {
            buckets: [0; BUCKETS],
            count: 0,
            sum_ns: 0,
            max_ns: 0,
            recent: VecDeque::with_capacity(RECENT),
        }
    }
}

/// Percentiles of what was recorded, in microseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencySnapshot {
    pub count: u64,
    /// Sum of all samples.
    pub sum_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub buckets: Vec<u64>,
}

impl LatencyRecorder {
    pub fn record(&mut self, ns: u64) {
        let us = ns / 1000;
        let bucket = if us == 0 {
            0
        } else {
            (64 - us.leading_zeros() as usize).min(BUCKETS - 1)
        };
        self.buckets[bucket] += 1;
        self.count += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
        self.max_ns = self.max_ns.max(ns);
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(ns);
    }

    pub fn snapshot(&self) -> LatencySnapshot {
        let mut sorted: Vec<u64> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        let pct = |p: f64| {
            if sorted.is_empty() {
                0.0
            } else {
                let idx = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
                sorted[idx] as f64 / 1000.0
            }
        };
        let last = self
            .buckets
            .iter()
            .rposition(|&c| c > 0)
            .map_or(0, |i| i + 1);
        LatencySnapshot {
            count: self.count,
            sum_us: self.sum_ns as f64 / 1000.0,
            p50_us: pct(0.50),
            p99_us: pct(0.99),
            max_us: self.max_ns as f64 / 1000.0,
            buckets: self.buckets[..last].to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_buckets() {
        let mut r = LatencyRecorder::default();
        assert_eq!(r.snapshot().count, 0);
        for us in 1..=100u64 {
            r.record(us * 1000);
        }
        let s = r.snapshot();
        assert_eq!(s.count, 100);
        assert_eq!(s.p50_us, 50.0);
        assert_eq!(s.p99_us, 99.0);
        assert_eq!(s.max_us, 100.0);
        assert_eq!(s.sum_us, 5050.0);
        // 1 us -> bucket 1, 2..3 -> 2, 4..7 -> 3, ..., 64..100 -> 7
        assert_eq!(s.buckets, vec![0, 1, 2, 4, 8, 16, 32, 37]);
        r.record(10);
        assert_eq!(r.snapshot().buckets[0], 1);
    }

    #[test]
    fn keeps_only_recent_samples_for_percentiles() {
        let mut r = LatencyRecorder::default();
        for _ in 0..RECENT {
            r.record(1_000_000);
        }
        for _ in 0..RECENT {
            r.record(1_000);
        }
        let s = r.snapshot();
        assert_eq!(s.count, 2 * RECENT as u64);
        assert_eq!(s.p99_us, 1.0);
        assert_eq!(s.max_us, 1000.0);
    }
}
