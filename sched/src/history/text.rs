//! The text form of a [`History`]: what the server keeps in its state
//! directory and the simulator reads as a history file.
//!
//! ```text
//! salus-history	1
//! spread	<sum of squared errors>	<count>
//! run	<tenant>	<name>	<fingerprint>	<device seconds>	<iterations>	<completed|failed|cancelled>
//! ```
//!
//! Fields are tab-separated; `%`, tab, CR and LF inside a field are written
//! `%25`, `%09`, `%0D`, `%0A`. An empty tenant is no tenant, an empty
//! fingerprint none. Runs go identity by identity, least recently run first,
//! each identity's oldest first, so reading them back in order restores the
//! eviction order. Blank lines and lines starting with `#` are skipped. Any
//! other deviation is an error naming its line: a file that does not parse is
//! not half-loaded.

use std::fmt::Write as _;

use super::{History, JobIdentity, PastRun, Record, RunEnd, Spread};

const HEADER: &str = "salus-history\t1";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("job history, line {line}: {why}")]
pub struct HistoryFileError {
    pub line: usize,
    pub why: String,
}

fn escape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    for c in field.chars() {
        match c {
            '%' => out.push_str("%25"),
            '\t' => out.push_str("%09"),
            '\r' => out.push_str("%0D"),
            '\n' => out.push_str("%0A"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(field: &str) -> Option<String> {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3)?;
        out.push(match code {
            "25" => '%',
            "09" => '\t',
            "0D" | "0d" => '\r',
            "0A" | "0a" => '\n',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

impl History {
    /// The store as text (see the module docs).
    pub fn to_text(&self) -> String {
        let mut out = format!("{HEADER}\n");
        let _ = writeln!(out, "spread\t{}\t{}", self.spread.sum_sq, self.spread.count);
        for id in self.identities() {
            for run in self.runs(id) {
                let _ = writeln!(
                    out,
                    "run\t{}\t{}\t{}\t{}\t{}\t{}",
                    escape(&id.tenant),
                    escape(&id.name),
                    escape(id.fingerprint.as_deref().unwrap_or("")),
                    run.device_s,
                    run.iterations,
                    run.end.name()
                );
            }
        }
        out
    }

    /// Reads [`Self::to_text`]'s form into a store of the default limits.
    pub fn parse(text: &str) -> Result<History, HistoryFileError> {
        History::parse_into(text, History::default())
    }

    /// Reads [`Self::to_text`]'s form into `empty` (its limits apply: the
    /// oldest runs and identities beyond them are dropped, as recording
    /// them would).
    pub fn parse_into(text: &str, empty: History) -> Result<History, HistoryFileError> {
        let mut history = empty;
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
        match lines.next() {
            Some((_, first)) if first.trim_end_matches('\r') == HEADER => {}
            _ => {
                return Err(HistoryFileError {
                    line: 1,
                    why: format!("expected the header {HEADER:?} (a job history file, format 1)"),
                })
            }
        }
        for (line, raw) in lines {
            let raw = raw.trim_end_matches('\r');
            if raw.trim().is_empty() || raw.starts_with('#') {
                continue;
            }
            let err = |why: String| HistoryFileError { line, why };
            let fields: Vec<&str> = raw.split('\t').collect();
            match fields[0] {
                "spread" => {
                    let [_, sum_sq, count] = fields[..] else {
                        return Err(err(format!(
                            "a spread line has 3 tab-separated fields, not {}",
                            fields.len()
                        )));
                    };
                    let number = |text: &str, what: &str| {
                        text.parse::<f64>()
                            .ok()
                            .filter(|v| v.is_finite() && *v >= 0.0)
                            .ok_or_else(|| err(format!("{what} {text:?} is not a number >= 0")))
                    };
                    history.spread = Spread {
                        sum_sq: number(sum_sq, "sum of squared errors")?,
                        count: number(count, "count")?,
                    };
                }
                "run" => {
                    let [_, tenant, name, fingerprint, device_s, iterations, end] = fields[..]
                    else {
                        return Err(err(format!(
                            "a run line has 7 tab-separated fields, not {}",
                            fields.len()
                        )));
                    };
                    let field = |text: &str, what: &str| {
                        unescape(text).ok_or_else(|| {
                            err(format!(
                                "{what} {text:?}: '%' must start %25, %09, %0D or %0A"
                            ))
                        })
                    };
                    let (tenant, name, fingerprint) = (
                        field(tenant, "tenant")?,
                        field(name, "name")?,
                        field(fingerprint, "fingerprint")?,
                    );
                    let device_s = device_s
                        .parse::<f64>()
                        .ok()
                        .filter(|v| v.is_finite() && *v >= 0.0)
                        .ok_or_else(|| {
                            err(format!("device seconds {device_s:?} is not a number >= 0"))
                        })?;
                    let iterations = iterations.parse::<u64>().map_err(|_| {
                        err(format!("iterations {iterations:?} is not a whole number"))
                    })?;
                    let end = RunEnd::from_name(end).ok_or_else(|| {
                        err(format!(
                            "run end {end:?} is not completed, failed or cancelled"
                        ))
                    })?;
                    let identity = JobIdentity::new(
                        &tenant,
                        &name,
                        Some(fingerprint.as_str()).filter(|f| !f.is_empty()),
                    );
                    history.restore(
                        identity,
                        PastRun {
                            device_s,
                            iterations,
                            end,
                        },
                    );
                }
                other => {
                    return Err(err(format!(
                        "unknown line kind {other:?} (expected spread or run)"
                    )))
                }
            }
        }
        Ok(history)
    }

    /// Adds a stored run as it was: no learning, bounds as in `record`.
    fn restore(&mut self, identity: JobIdentity, run: PastRun) {
        self.clock += 1;
        if !self.records.contains_key(&identity) && self.records.len() >= self.max_identities {
            self.evict_least_recent_of(None);
        }
        let record: &mut Record = self.records.entry(identity).or_default();
        record.runs.push(run);
        if record.runs.len() > self.max_runs {
            record.runs.remove(0);
        }
        record.last_used = self.clock;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_odd_names_and_keeps_the_eviction_order() {
        let mut h = History::default();
        let odd = JobIdentity::new("team\tA", "50% done\nreally", Some("sha:1"));
        let plain = JobIdentity::new("", "train.py", None);
        h.record(
            &odd,
            PastRun {
                device_s: 12.5,
                iterations: 3,
                end: RunEnd::Completed,
            },
        );
        h.record(
            &plain,
            PastRun {
                device_s: 60.0,
                iterations: 100,
                end: RunEnd::Failed,
            },
        );
        h.record(
            &odd,
            PastRun {
                device_s: 14.0,
                iterations: 3,
                end: RunEnd::Completed,
            },
        );
        let text = h.to_text();
        let back = History::parse(&text).unwrap();
        assert_eq!(back.runs(&odd), h.runs(&odd));
        assert_eq!(back.runs(&plain), h.runs(&plain));
        assert_eq!(back.spread(), h.spread());
        assert_eq!(back.identities(), h.identities());
        assert_eq!(back.to_text(), text);
    }

    #[test]
    fn bad_files_are_errors_naming_the_line() {
        let cases = [
            ("nonsense\n", 1, "header"),
            ("salus-history\t1\n\nrun\ta\tb\n", 3, "7 tab-separated"),
            (
                "salus-history\t1\nrun\t\tb\t\tx\t1\tcompleted\n",
                2,
                "device seconds",
            ),
            (
                "salus-history\t1\nrun\t\tb\t\t1\t-1\tcompleted\n",
                2,
                "iterations",
            ),
            (
                "salus-history\t1\nrun\t\tb\t\t1\t1\texploded\n",
                2,
                "run end",
            ),
            (
                "salus-history\t1\nrun\t\tb%zz\t\t1\t1\tcompleted\n",
                2,
                "'%'",
            ),
            ("salus-history\t1\n# fine\nspread\t1\n", 3, "spread"),
            ("salus-history\t1\nwhat\n", 2, "unknown line kind"),
        ];
        for (text, line, words) in cases {
            let err = History::parse(text).unwrap_err();
            assert_eq!(err.line, line, "{text:?}: {err}");
            assert!(err.to_string().contains(words), "{text:?}: {err}");
        }
    }

    #[test]
    fn reading_applies_the_store_bounds() {
        let mut text = String::from("salus-history\t1\n");
        for k in 0..10 {
            text.push_str(&format!("run\tt\tjob{k}\t\t{k}\t1\tcompleted\n"));
            text.push_str(&format!("run\tt\tjob0\t\t{k}\t1\tcompleted\n"));
        }
        let h = History::parse_into(&text, History::with_limits(3, 2)).unwrap();
        assert_eq!(h.len(), 3);
        let job0 = JobIdentity::new("t", "job0", None);
        let kept: Vec<f64> = h.runs(&job0).iter().map(|r| r.device_s).collect();
        assert_eq!(kept, [8.0, 9.0]);
    }
}
