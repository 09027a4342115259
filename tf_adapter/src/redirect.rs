//! Whether a new session goes to the Salus server, and the options it is made with there.

use std::ffi::{c_int, CString};

use crate::config_proto::{new_metadata_version, with_job_metadata};
use crate::options_table::OptionsTable;
use crate::probe::check_reachable;
use crate::settings::Settings;
use crate::tf::{self, real, OwnedStatus, TF_SessionOptions};

/// Why a session could not be sent to the server: a TF_Code and a message for the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: c_int,
    pub message: String,
}

impl Refusal {
    pub fn new(code: c_int, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: format!("salus: {}", message.into()),
        }
    }
}

impl From<tf::Missing> for Refusal {
    fn from(missing: tf::Missing) -> Self {
        Refusal::new(tf::TF_INTERNAL, missing.to_string())
    }
}

/// A session bound for the server: where, and the config it carries (the program's own
/// plus the job's metadata).
pub struct Redirect {
    pub settings: Settings,
    pub config: Vec<u8>,
}

/// `Ok(None)`: leave the session alone (no SALUS_SERVER, or the program chose a target).
pub fn plan(
    table: &OptionsTable,
    opts: *const TF_SessionOptions,
) -> Result<Option<Redirect>, Refusal> {
    let Some(settings) = Settings::from_env() else {
        return Ok(None);
    };
    let entry = table.get(opts as usize);
    if entry.target_set {
        return Ok(None);
    }
    let settings = settings.map_err(|e| Refusal::new(tf::TF_INVALID_ARGUMENT, e.to_string()))?;
    let config = with_job_metadata(
        &entry.config,
        &settings.metadata_name(),
        new_metadata_version(),
    )
    .map_err(|_| {
        Refusal::new(
            tf::TF_INTERNAL,
            "the session's ConfigProto could not be read",
        )
    })?;
    check_reachable(&settings.server, settings.connect_timeout_s)
        .map_err(|m| Refusal::new(tf::TF_UNAVAILABLE, m))?;
    Ok(Some(Redirect { settings, config }))
}

/// Fresh options for the server (the program's own are never modified); deleted on drop.
pub struct RemoteOptions(*mut TF_SessionOptions);

impl RemoteOptions {
    pub fn new(redirect: &Redirect) -> Result<Self, Refusal> {
        let target = CString::new(redirect.settings.target()).map_err(|_| {
            Refusal::new(tf::TF_INVALID_ARGUMENT, "SALUS_SERVER contains a NUL byte")
        })?;
        let status = OwnedStatus::new()?;
        // SAFETY: the options are TensorFlow's own and live until drop; TF copies target and config.
        unsafe {
            let opts = RemoteOptions(real::TF_NewSessionOptions()?());
            real::TF_SetTarget()?(opts.0, target.as_ptr());
            real::TF_SetConfig()?(
                opts.0,
                redirect.config.as_ptr().cast(),
                redirect.config.len(),
                status.ptr(),
            );
            status
                .check()
                .map_err(|(code, m)| Refusal::new(code, format!("config refused: {m}")))?;
            Ok(opts)
        }
    }

    pub fn ptr(&self) -> *const TF_SessionOptions {
        self.0
    }
}

impl Drop for RemoteOptions {
    fn drop(&mut self) {
        if let Ok(delete) = real::TF_DeleteSessionOptions() {
            // SAFETY: made by TF_NewSessionOptions in new(), deleted once.
            unsafe { delete(self.0) };
        }
    }
}
