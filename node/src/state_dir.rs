//! The server's state directory (`--state-dir`): what must outlive the
//! process. Each kind of state is a [`StateDocument`], one versioned JSON file
//! of its own, written atomically (a temporary file in the same directory,
//! fsynced, renamed over the old one, then the directory fsynced), so a crash
//! or a power cut leaves either the old file or the new one, never half of one.
//!
//! Files are the server user's alone (0600; the directory 0700 when the server
//! creates it). A file that cannot be read or decoded never stops the server:
//! [`StateDir::load`] moves it aside (`NAME.bad-<unix time>`) and says why, and
//! the server starts without what it held.
//!
//! One server uses a directory at a time: [`StateDir::open`] takes an
//! exclusive lock (`DIR/lock`, flock) held until the process ends, so two
//! servers given the same directory (a copied unit file) cannot overwrite each
//! other's state.
//!
//! Kept here today: the issued tokens ([`crate::tenant::tokens`],
//! `tokens.json`). Learned job statistics are the next document: a type with
//! its own file name and version implementing [`StateDocument`], saved with
//! [`StateDir::save`] and read at start with [`StateDir::load`].

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// One kind of state, kept in a file of its own in the state directory.
pub trait StateDocument: Serialize + DeserializeOwned {
    /// The file's name in the directory (`tokens.json`).
    const FILE: &'static str;
    /// The format version written. A file of another version is not read: it
    /// is moved aside like a corrupt one (a downgraded server cannot guess
    /// what a newer one meant).
    const VERSION: u32;
    /// What the file holds, for logs ("issued tokens").
    const WHAT: &'static str;
}

/// The largest state file read; a larger one is treated as corrupt rather
/// than read into memory (a token entry is about 300 bytes).
const MAX_FILE_BYTES: u64 = 64 << 20;

/// Why the state directory cannot be used, or a document not saved.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    #[error("cannot create the state directory {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the state directory {path} is not a directory")]
    NotADirectory { path: PathBuf },
    #[error(
        "the state directory {path} is in use by another salus-server (a process holds the lock on \
         {path}/lock): give each server its own --state-dir"
    )]
    InUse { path: PathBuf },
    #[error("cannot lock the state directory {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot encode the {what}: {source}")]
    Encode {
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What a file on disk looks like: the document under a format version.
#[derive(Serialize)]
struct Envelope<'a, T> {
    version: u32,
    /// When it was written, for people reading the file.
    saved_unix_s: u64,
    data: &'a T,
}

/// The version alone, read before the data is decoded.
#[derive(Deserialize)]
struct VersionOnly {
    version: u32,
}

#[derive(Deserialize)]
struct DataOnly<T> {
    data: T,
}

/// A state file that could not be used, and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// The file.
    pub file: PathBuf,
    /// Why it was not used (cannot be read, not JSON, another version...).
    pub why: String,
    /// Where its bytes are kept now (None: they could not be moved or copied,
    /// and `why` says so too).
    pub kept_as: Option<PathBuf>,
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.why)?;
        match &self.kept_as {
            Some(kept) => write!(f, "; kept as {}", kept.display()),
            None => write!(f, "; no copy could be kept"),
        }
    }
}

/// What [`StateDir::load`] found.
#[derive(Debug)]
pub enum Loaded<T> {
    /// No file: nothing was saved yet.
    Missing,
    Restored(T),
    /// A file that could not be used (moved aside).
    Dropped(Dropped),
}

/// An open, locked state directory.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    /// Held (flock) for the life of the process; opened close-on-exec, so
    /// executor processes do not inherit it.
    _lock: File,
}

impl StateDir {
    /// Creates `path` (0700; its missing parents as the umask allows) if it
    /// does not exist, and locks it for this process.
    pub fn open(path: &Path) -> Result<StateDir, StateDirError> {
        // Against the working directory, without touching the filesystem.
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| StateDirError::Create {
                path: path.clone(),
                source,
            })?;
        }
        match DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(StateDirError::Create { path, source }),
        }
        let meta = std::fs::metadata(&path).map_err(|source| StateDirError::Create {
            path: path.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(StateDirError::NotADirectory { path });
        }
        if meta.permissions().mode() & 0o077 != 0 {
            // An operator's existing directory keeps its mode (it may be
            // shared, e.g. the server's working directory): the files are
            // 0600 whatever the directory's mode.
            tracing::warn!(dir = %path.display(), mode = format!("{:o}", meta.permissions().mode() & 0o7777),
                "the state directory is open to other users; its files are 0600, but 0700 is advisable");
        }
        let lock_path = path.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|source| StateDirError::Lock {
                path: path.clone(),
                source,
            })?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            return Err(if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                StateDirError::InUse { path }
            } else {
                StateDirError::Lock { path, source: err }
            });
        }
        Ok(StateDir { path, _lock: lock })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file of document `T`.
    pub fn file_of<T: StateDocument>(&self) -> PathBuf {
        self.path.join(T::FILE)
    }

    /// Reads document `T`. A file that cannot be read, is not valid JSON of
    /// `T`, or has another version is moved aside and reported, never an error:
    /// the server starts without it.
    pub fn load<T: StateDocument>(&self) -> Loaded<T> {
        let file = self.file_of::<T>();
        let bytes = match read_capped(&file) {
            Ok(None) => return Loaded::Missing,
            Ok(Some(bytes)) => bytes,
            Err(why) => return Loaded::Dropped(self.set_aside(&file, why)),
        };
        match decode::<T>(&bytes) {
            Ok(document) => Loaded::Restored(document),
            Err(why) => Loaded::Dropped(self.set_aside(&file, why)),
        }
    }

    /// Keeps a copy of `file`'s bytes as it stands (for a file read only in
    /// part: some entries were dropped), next to it as `NAME.bad-<unix time>`.
    pub fn keep_copy(&self, file: &Path) -> Result<PathBuf, std::io::Error> {
        let kept = self.bad_name(file);
        std::fs::copy(file, &kept)?;
        Ok(kept)
    }

    /// Writes document `T` atomically, mode 0600.
    pub fn save<T: StateDocument>(&self, document: &T) -> Result<(), StateDirError> {
        let envelope = Envelope {
            version: T::VERSION,
            saved_unix_s: unix_seconds(SystemTime::now()),
            data: document,
        };
        let mut bytes =
            serde_json::to_vec_pretty(&envelope).map_err(|source| StateDirError::Encode {
                what: T::WHAT,
                source,
            })?;
        bytes.push(b'\n');
        let file = self.file_of::<T>();
        write_atomically(&self.path, &file, &bytes)
            .map_err(|source| StateDirError::Write { path: file, source })
    }

    /// Moves an unusable file aside (copying it if it cannot be moved).
    fn set_aside(&self, file: &Path, why: String) -> Dropped {
        let kept = self.bad_name(file);
        let kept_as = match std::fs::rename(file, &kept) {
            Ok(()) => Ok(kept),
            Err(_) => std::fs::copy(file, &kept).map(|_| kept),
        };
        match kept_as {
            Ok(kept) => Dropped {
                file: file.to_path_buf(),
                why,
                kept_as: Some(kept),
            },
            Err(err) => Dropped {
                file: file.to_path_buf(),
                why: format!("{why} (and it cannot be moved or copied aside: {err})"),
                kept_as: None,
            },
        }
    }

    /// `NAME.bad-<unix time>`, with `.N` added when that name is taken.
    fn bad_name(&self, file: &Path) -> PathBuf {
        let name = file
            .file_name()
            .map_or_else(|| "state".into(), |n| n.to_string_lossy().into_owned());
        let base = format!("{name}.bad-{}", unix_seconds(SystemTime::now()));
        let mut candidate = self.path.join(&base);
        let mut n = 1;
        while candidate.symlink_metadata().is_ok() {
            candidate = self.path.join(format!("{base}.{n}"));
            n += 1;
        }
        candidate
    }
}

/// The file's bytes; None if it does not exist; Err(why) if it cannot be read
/// or is larger than [`MAX_FILE_BYTES`].
fn read_capped(file: &Path) -> Result<Option<Vec<u8>>, String> {
    let mut opened = match File::open(file) {
        Ok(opened) => opened,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(format!("cannot be read: {err}")),
    };
    let mut bytes = Vec::new();
    Read::by_ref(&mut opened)
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| format!("cannot be read: {err}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "larger than {MAX_FILE_BYTES} bytes: not a file this server wrote"
        ));
    }
    Ok(Some(bytes))
}

fn decode<T: StateDocument>(bytes: &[u8]) -> Result<T, String> {
    let version: VersionOnly = serde_json::from_slice(bytes)
        .map_err(|err| format!("not a state file of this server ({err})"))?;
    if version.version != T::VERSION {
        return Err(format!(
            "format version {}, and this server reads version {} of the {}",
            version.version,
            T::VERSION,
            T::WHAT
        ));
    }
    let data: DataOnly<T> = serde_json::from_slice(bytes)
        .map_err(|err| format!("the {} cannot be decoded ({err})", T::WHAT))?;
    Ok(data.data)
}

/// Writes `bytes` to `file` atomically and durably, mode 0600 (a file of the
/// state directory that is no [`StateDocument`]).
pub fn write_private(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = file.parent().unwrap_or(Path::new("."));
    write_atomically(dir, file, bytes)
}

/// Writes `bytes` to a temporary file in `dir`, fsyncs it, renames it over
/// `file` and fsyncs `dir`, so the rename itself is durable.
fn write_atomically(dir: &Path, file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = file
        .file_name()
        .map_or_else(|| "state".into(), |n| n.to_string_lossy().into_owned());
    // One server per directory (the lock), and its saves of one document are
    // serialized by the caller: the name needs no more to be unique.
    let temp = dir.join(format!(".{name}.tmp"));
    // A temporary file left by a crash may have another mode: start afresh.
    let _ = std::fs::remove_file(&temp);
    let written = (|| {
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        out.write_all(bytes)?;
        out.sync_all()?;
        drop(out);
        std::fs::rename(&temp, file)?;
        File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

pub fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The state directory when `--state-dir` is not given: `/var/lib/salus/state`
/// for root (a system service; the Kubernetes DaemonSet's volume is mounted
/// at /var/lib/salus), else `$XDG_STATE_HOME/salus` or
/// `~/.local/state/salus`. None: no home to put it under.
pub fn default_state_dir() -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Some(PathBuf::from("/var/lib/salus/state"));
    }
    let absolute = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    absolute("XDG_STATE_HOME")
        .map(|base| base.join("salus"))
        .or_else(|| absolute("HOME").map(|home| home.join(".local/state/salus")))
}

/// A fresh directory path under the system's temporary directory (tests).
#[cfg(test)]
pub(crate) fn temp_dir(label: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "salus-state-test-{}-{label}-{n}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Notes {
        lines: Vec<String>,
    }

    impl StateDocument for Notes {
        const FILE: &'static str = "notes.json";
        const VERSION: u32 = 3;
        const WHAT: &'static str = "notes";
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_document_round_trips_with_private_modes_and_no_leftovers() {
        let path = temp_dir("round-trip").join("nested");
        let dir = StateDir::open(&path).unwrap();
        assert!(matches!(dir.load::<Notes>(), Loaded::Missing));
        let notes = Notes {
            lines: vec!["a".into(), "b\n\"c\"".into()],
        };
        dir.save(&notes).unwrap();
        dir.save(&notes).unwrap();
        match dir.load::<Notes>() {
            Loaded::Restored(read) => assert_eq!(read, notes),
            other => panic!("{other:?}"),
        }
        assert_eq!(mode(&path), 0o700);
        assert_eq!(mode(&path.join("notes.json")), 0o600);
        let mut names: Vec<String> = std::fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["lock", "notes.json"], "no temporary file is left");
        let text = std::fs::read_to_string(path.join("notes.json")).unwrap();
        assert!(text.contains("\"version\": 3"), "{text}");
        drop(dir);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_save_replaces_the_file_whole_even_over_a_stale_temporary_file() {
        let path = temp_dir("atomic");
        let dir = StateDir::open(&path).unwrap();
        // A crash between writing and renaming leaves the temporary file,
        // with any mode; the old file stays whole and is what loads.
        dir.save(&Notes {
            lines: vec!["old".into()],
        })
        .unwrap();
        let temp = path.join(".notes.json.tmp");
        std::fs::write(&temp, b"{half").unwrap();
        std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o666)).unwrap();
        match dir.load::<Notes>() {
            Loaded::Restored(read) => assert_eq!(read.lines, ["old"]),
            other => panic!("{other:?}"),
        }
        dir.save(&Notes {
            lines: vec!["new".into(); 1000],
        })
        .unwrap();
        assert!(!temp.exists());
        assert_eq!(mode(&path.join("notes.json")), 0o600);
        match dir.load::<Notes>() {
            Loaded::Restored(read) => assert_eq!(read.lines.len(), 1000),
            other => panic!("{other:?}"),
        }
        drop(dir);
        let _ = std::fs::remove_dir_all(&path);
    }

    #[test]
    fn unusable_files_are_moved_aside_and_reported() {
        let path = temp_dir("corrupt");
        let dir = StateDir::open(&path).unwrap();
        let file = path.join("notes.json");
        let cases: [(&[u8], &str); 4] = [
            (
                b"{\"version\": 3, \"data\": {\"lines\": [",
                "not a state file",
            ),
            (b"\xff\xfe garbage", "not a state file"),
            (
                b"{\"version\": 4, \"data\": {\"lines\": []}}",
                "format version 4, and this server reads version 3 of the notes",
            ),
            (
                b"{\"version\": 3, \"data\": {\"lines\": 7}}",
                "the notes cannot be decoded",
            ),
        ];
        for (bytes, why) in cases {
            std::fs::write(&file, bytes).unwrap();
            let Loaded::Dropped(dropped) = dir.load::<Notes>() else {
                panic!("{bytes:?} was not dropped");
            };
            assert_eq!(dropped.file, file);
            assert!(dropped.why.contains(why), "{}", dropped.why);
            let kept = dropped.kept_as.clone().unwrap();
            assert!(
                kept.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("notes.json.bad-"),
                "{kept:?}"
            );
            assert_eq!(std::fs::read(&kept).unwrap(), bytes);
            assert!(
                !file.exists(),
                "the bad file is moved, not left to fail again"
            );
            assert!(dropped.to_string().contains("kept as"), "{dropped}");
        }
        // A file that cannot be read (here: a directory in its place).
        std::fs::create_dir(&file).unwrap();
        let Loaded::Dropped(dropped) = dir.load::<Notes>() else {
            panic!("an unreadable file was not dropped");
        };
        assert!(dropped.why.contains("cannot be read"), "{}", dropped.why);
        assert!(dropped.kept_as.unwrap().is_dir() && !file.exists());
        // Five bad files in one second get five names.
        let bad = std::fs::read_dir(&path)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains(".bad-")
            })
            .count();
        assert_eq!(bad, 5);
        drop(dir);
        let _ = std::fs::remove_dir_all(&path);
    }

    #[test]
    fn one_server_at_a_time_uses_a_directory() {
        let path = temp_dir("lock");
        let first = StateDir::open(&path).unwrap();
        let second = StateDir::open(&path).unwrap_err();
        assert!(matches!(second, StateDirError::InUse { .. }), "{second}");
        assert!(second.to_string().contains("its own --state-dir"));
        drop(first);
        let again = StateDir::open(&path).unwrap();
        drop(again);
        let file = path.join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            StateDir::open(&file),
            Err(StateDirError::NotADirectory { .. })
        ));
        let _ = std::fs::remove_dir_all(&path);
    }
}
