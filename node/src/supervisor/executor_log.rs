//! An executor's stderr, copied into the server's: each line marked with the
//! executor, within a byte budget per executor (`--executor-log-rate`), so a
//! tenant printing without end (`tf.print` to stderr in a loop) cannot fill
//! the server's log or take the supervisor's time from other tenants. The
//! last lines are kept, budget or not, for the message of the executor's death.

use std::collections::VecDeque;
use std::io::{self, BufRead, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Lines kept for the death message.
const KEPT_LINES: usize = 400;

/// Bytes of a line kept for the death message (a fatal message is short; 400
/// pieces of [`MAX_LINE`] would hold 25 MiB per executor).
const KEPT_LINE_BYTES: usize = 1024;

/// Longest line read as one: a longer one (a tenant printing gigabytes
/// without a newline) is taken in pieces of this size, so the copy never
/// holds more than this of an executor's output.
const MAX_LINE: usize = 64 << 10;

/// Seconds of the rate an executor may print at once (its start-up lines, a
/// traceback) before lines are dropped.
const BURST_SECONDS: u64 = 16;

/// How often, at most, a flood's dropped lines are reported while it lasts.
const DROP_NOTE_EVERY: Duration = Duration::from_secs(10);

/// A token bucket of bytes.
pub struct LogBudget {
    /// Bytes per second; `None`: no limit.
    rate: Option<u64>,
    /// The most `tokens` holds: [`BURST_SECONDS`] of the rate.
    burst: f64,
    tokens: f64,
    at: Instant,
    dropped_lines: u64,
    dropped_bytes: u64,
    noted: Option<Instant>,
}

impl LogBudget {
    pub fn new(rate: Option<u64>, now: Instant) -> LogBudget {
        let burst = rate.map_or(0.0, |r| r.saturating_mul(BURST_SECONDS) as f64);
        LogBudget {
            rate,
            burst,
            tokens: burst,
            at: now,
            dropped_lines: 0,
            dropped_bytes: 0,
            noted: None,
        }
    }

    /// Whether a line of `len` bytes may be copied now; if not, it is
    /// counted as dropped.
    pub fn admit(&mut self, len: usize, now: Instant) -> bool {
        let Some(rate) = self.rate else { return true };
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * rate as f64).min(self.burst);
        if self.tokens >= len as f64 {
            self.tokens -= len as f64;
            return true;
        }
        self.dropped_lines += 1;
        self.dropped_bytes += len as u64;
        false
    }

    /// A note on the lines dropped since the last one: the first drop's at
    /// once, then at most every [`DROP_NOTE_EVERY`] while drops go on (a
    /// flood lets a line through now and then: no note for each), and the
    /// rest at the end.
    pub fn drop_note(&mut self, now: Instant, ended: bool) -> Option<String> {
        if self.dropped_lines == 0 {
            return None;
        }
        let due = ended
            || self
                .noted
                .is_none_or(|at| now.saturating_duration_since(at) >= DROP_NOTE_EVERY);
        if !due {
            return None;
        }
        let note = format!(
            "salus: {} lines ({} bytes) of this executor's output were not copied here: over \
             --executor-log-rate ({} bytes/s)",
            self.dropped_lines,
            self.dropped_bytes,
            self.rate.unwrap_or(0)
        );
        self.dropped_lines = 0;
        self.dropped_bytes = 0;
        self.noted = Some(now);
        Some(note)
    }
}

/// Copies an executor's stderr to the server's until it ends (on a thread of
/// its own) and keeps the last lines in `last`; TensorFlow's INFO noise is
/// left out unless `verbose`. The returned channel hears when it ended.
pub fn forward_stderr(
    stderr: impl std::io::Read + Send + 'static,
    label: String,
    last: Arc<Mutex<VecDeque<String>>>,
    verbose: bool,
    rate: Option<u64>,
) -> std::sync::mpsc::Receiver<()> {
    let (ended_tx, ended) = std::sync::mpsc::channel();
    let _ = std::thread::Builder::new()
        .name("salus-exec-log".into())
        .spawn(move || {
            let mut budget = LogBudget::new(rate, Instant::now());
            let mut reader = std::io::BufReader::with_capacity(MAX_LINE, stderr);
            let mut piece = Vec::new();
            while let Ok(true) = next_line(&mut reader, &mut piece) {
                let line = String::from_utf8_lossy(&piece).into_owned();
                if verbose || !crate::tf_log::is_tensorflow_noise(&line) {
                    let now = Instant::now();
                    // Charged as written: the label too (a flood of short lines).
                    let copying = budget.admit(written_len(&label, &line), now);
                    if let Some(note) = budget.drop_note(now, false) {
                        write_line(&label, &note);
                    }
                    if copying {
                        write_line(&label, &line);
                    }
                }
                let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
                if last.len() == KEPT_LINES {
                    last.pop_front();
                }
                last.push_back(kept(line));
            }
            if let Some(note) = budget.drop_note(Instant::now(), true) {
                write_line(&label, &note);
            }
            let _ = ended_tx.send(());
        });
    ended
}

/// The next line without its newline, or a piece of [`MAX_LINE`] bytes of a
/// longer one; false at the end of the stream.
fn next_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<bool> {
    line.clear();
    let read = reader.take(MAX_LINE as u64).read_until(b'\n', line)?;
    if line.last() == Some(&b'\n') {
        line.pop();
    }
    Ok(read > 0)
}

/// The start of `line`, at most [`KEPT_LINE_BYTES`] (on a character boundary).
fn kept(mut line: String) -> String {
    if line.len() > KEPT_LINE_BYTES {
        let mut end = KEPT_LINE_BYTES;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
    }
    line
}

/// Bytes [`write_line`] writes for `line`.
fn written_len(label: &str, line: &str) -> usize {
    "[executor ] \n".len() + label.len() + line.len()
}

/// One line, one write: lines of several executors never interleave.
fn write_line(label: &str, line: &str) {
    let _ = std::io::stderr().lock().write_all(&labelled(label, line));
}

/// `line` as it is written into the server's log: prefixed with its executor,
/// or under `--log-format json` a JSON object with an "executor" key.
fn labelled(label: &str, line: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(written_len(label, line));
    if crate::log_json::enabled() {
        let _ = writeln!(out, "{}", crate::log_json::relayed(line, "executor", label));
    } else {
        let _ = writeln!(out, "[executor {label}] {line}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_cut_to_the_rate_after_its_burst_and_noted_now_and_then() {
        let start = Instant::now();
        let mut budget = LogBudget::new(Some(100), start);
        // The burst: 16 s of the rate at once.
        let copied = (0..100).filter(|_| budget.admit(20, start)).count();
        assert_eq!(copied, 80);
        let note = budget
            .drop_note(start, false)
            .expect("the first drop is noted at once");
        assert!(note.contains("20 lines (400 bytes)"), "{note}");
        // A second later 100 bytes are back: five lines, not six; the drop
        // waits for its note (a flood lets lines through every second).
        let later = start + Duration::from_secs(1);
        let copied = (0..6).filter(|_| budget.admit(20, later)).count();
        assert_eq!(copied, 5);
        assert_eq!(budget.drop_note(later, false), None);
        let much_later = start + DROP_NOTE_EVERY;
        assert!(budget.admit(20, much_later));
        let again = budget
            .drop_note(much_later, false)
            .expect("noted again after the interval");
        assert!(again.contains("1 lines (20 bytes)"), "{again}");
        assert!(!budget.admit(2000, much_later), "more than the burst");
        let last = budget
            .drop_note(much_later, true)
            .expect("the rest at the end");
        assert!(last.contains("1 lines (2000 bytes)"), "{last}");
        assert_eq!(
            budget.drop_note(much_later, true),
            None,
            "nothing new to say"
        );
    }

    #[test]
    fn a_line_without_end_is_read_in_pieces() {
        let mut text = vec![b'x'; 3 * MAX_LINE + 5];
        text.extend_from_slice(b"\nshort\n\nlast");
        let mut reader = io::Cursor::new(text);
        let mut line = Vec::new();
        let mut lengths = Vec::new();
        while next_line(&mut reader, &mut line).unwrap() {
            lengths.push(line.len());
        }
        assert_eq!(lengths, [MAX_LINE, MAX_LINE, MAX_LINE, 5, 5, 0, 4]);
        assert_eq!(kept("é".repeat(KEPT_LINE_BYTES)).len(), KEPT_LINE_BYTES);
        assert_eq!(
            kept(format!("x{}", "é".repeat(KEPT_LINE_BYTES))).len(),
            KEPT_LINE_BYTES - 1
        );
        assert_eq!(kept("short".into()), "short");
        assert_eq!(written_len("ta:7", "é"), labelled("ta:7", "é").len());
    }

    #[test]
    fn no_rate_copies_everything() {
        let now = Instant::now();
        let mut budget = LogBudget::new(None, now);
        assert!((0..10_000).all(|_| budget.admit(1 << 20, now)));
        assert_eq!(budget.drop_note(now, true), None);
    }
}
