//! libsalus_tf.so: preloaded into a program that uses TensorFlow's C API (C/C++, Go, Java,
//! .NET, Rust bindings), it sends the program's sessions to a Salus server.
//!
//! With `SALUS_SERVER` set, a session made with no target (TF_NewSession,
//! TF_LoadSessionFromSavedModel) is made with target `grpc://SALUS_SERVER` and the job's
//! name and hints (SALUS_JOB_NAME, SALUS_PRIORITY, ...) in its config; without it every
//! call is forwarded untouched. A SavedModel is restored on the client (its files are
//! there) and its variables' values are shipped into the server's session.
//!
//! With `SALUS_TOKEN` set, the tenant token is added to `TF_GRPC_DEFAULT_OPTIONS` when the
//! library is loaded (`token.rs`), so every gRPC call TensorFlow makes carries it in its
//! user agent, whether or not SALUS_SERVER is set (a program may name the server itself).
//!
//! Every exported function is a panic boundary: a panic becomes a TF_Status error (or a
//! plain forward where the function has no status), never an unwind into C.

#![allow(non_snake_case, clippy::missing_safety_doc)]

mod checkpoint_stub;
mod config_proto;
mod options_table;
mod probe;
mod redirect;
mod saved_model;
mod settings;
mod tf;
mod token;
mod wire;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::LazyLock;

use options_table::OptionsTable;
use redirect::{plan, Redirect, Refusal, RemoteOptions};
use tf::{real, TF_Buffer, TF_Graph, TF_Session, TF_SessionOptions, TF_Status};

static OPTIONS: LazyLock<OptionsTable> = LazyLock::new(OptionsTable::default);

/// Run by the dynamic loader when the library is loaded: for a preloaded library, before `main`
/// and before the program has other threads (setenv is not safe once they run), and so before
/// TensorFlow can create its first gRPC channel and read `TF_GRPC_DEFAULT_OPTIONS`.
#[used]
#[link_section = ".init_array"]
static APPLY_TOKEN_AT_LOAD: extern "C" fn() = apply_token_at_load;

extern "C" fn apply_token_at_load() {
    if catch_unwind(token::apply_env).is_err() {
        // Not eprintln!: nothing may unwind out of a constructor.
        let _ = writeln!(
            std::io::stderr(),
            "salus: internal error applying SALUS_TOKEN; not sent"
        );
    }
}

/// Reports a refusal to the program: on stderr (a C program may print only the code) and in its status.
fn refuse(status: *mut TF_Status, refusal: &Refusal) {
    eprintln!("{}", refusal.message);
    tf::set_status(status, refusal.code, &refusal.message);
}

/// Runs `body`; a panic is reported in `status` and `fallback` is returned.
fn boundary<T>(what: &str, status: *mut TF_Status, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(_) => {
            refuse(
                status,
                &Refusal::new(
                    tf::TF_INTERNAL,
                    format!("internal error in the shim's {what}"),
                ),
            );
            fallback
        }
    }
}

/// For functions without a status: a missing TensorFlow function or a panic is reported on stderr.
fn quiet_boundary(what: &str, body: impl FnOnce() -> Result<(), tf::Missing>) {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {}
        Ok(Err(missing)) => eprintln!("salus: {missing} (in {what})"),
        Err(_) => eprintln!("salus: internal error in the shim's {what}"),
    }
}

#[no_mangle]
pub unsafe extern "C" fn TF_NewSessionOptions() -> *mut TF_SessionOptions {
    let mut opts = std::ptr::null_mut();
    quiet_boundary("TF_NewSessionOptions", || {
        opts = real::TF_NewSessionOptions()?();
        if !opts.is_null() {
            OPTIONS.created(opts as usize);
        }
        Ok(())
    });
    opts
}

#[no_mangle]
pub unsafe extern "C" fn TF_DeleteSessionOptions(opts: *mut TF_SessionOptions) {
    quiet_boundary("TF_DeleteSessionOptions", || {
        OPTIONS.deleted(opts as usize);
        real::TF_DeleteSessionOptions()?(opts);
        Ok(())
    });
}

#[no_mangle]
pub unsafe extern "C" fn TF_SetTarget(opts: *mut TF_SessionOptions, target: *const c_char) {
    quiet_boundary("TF_SetTarget", || {
        real::TF_SetTarget()?(opts, target);
        if !target.is_null() {
            OPTIONS.set_target(opts as usize, CStr::from_ptr(target).to_bytes());
        }
        Ok(())
    });
}

#[no_mangle]
pub unsafe extern "C" fn TF_SetConfig(
    opts: *mut TF_SessionOptions,
    proto: *const c_void,
    proto_len: usize,
    status: *mut TF_Status,
) {
    boundary("TF_SetConfig", status, (), || {
        let set = match real::TF_SetConfig() {
            Ok(set) => set,
            Err(missing) => return refuse(status, &missing.into()),
        };
        set(opts, proto, proto_len, status);
        if tf::status_result(status).is_ok() {
            let bytes = if proto.is_null() || proto_len == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(proto.cast::<u8>(), proto_len)
            };
            OPTIONS.set_config(opts as usize, bytes);
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TF_NewSession(
    graph: *mut TF_Graph,
    opts: *const TF_SessionOptions,
    status: *mut TF_Status,
) -> *mut TF_Session {
    boundary(
        "TF_NewSession",
        status,
        std::ptr::null_mut(),
        || match new_session(graph, opts, status) {
            Ok(session) => session,
            Err(refusal) => {
                refuse(status, &refusal);
                std::ptr::null_mut()
            }
        },
    )
}

unsafe fn new_session(
    graph: *mut TF_Graph,
    opts: *const TF_SessionOptions,
    status: *mut TF_Status,
) -> Result<*mut TF_Session, Refusal> {
    let real_new = real::TF_NewSession()?;
    let Some(redirect) = plan(&OPTIONS, opts)? else {
        return Ok(real_new(graph, opts, status));
    };
    let remote = RemoteOptions::new(&redirect)?;
    log_redirect(&redirect, "session");
    Ok(real_new(graph, remote.ptr(), status))
}

fn log_redirect(redirect: &Redirect, what: &str) {
    if redirect.settings.verbose {
        eprintln!(
            "salus: {what} -> {} as {:?}",
            redirect.settings.target(),
            redirect.settings.metadata_name()
        );
    }
}

#[no_mangle]
pub unsafe extern "C" fn TF_LoadSessionFromSavedModel(
    session_options: *const TF_SessionOptions,
    run_options: *const TF_Buffer,
    export_dir: *const c_char,
    tags: *const *const c_char,
    tags_len: c_int,
    graph: *mut TF_Graph,
    meta_graph_def: *mut TF_Buffer,
    status: *mut TF_Status,
) -> *mut TF_Session {
    boundary(
        "TF_LoadSessionFromSavedModel",
        status,
        std::ptr::null_mut(),
        || {
            let request = saved_model::LoadRequest {
                session_options,
                run_options,
                export_dir,
                tags,
                tags_len,
                graph,
                meta_graph_def,
                status,
            };
            let result = real::TF_LoadSessionFromSavedModel()
                .map_err(Refusal::from)
                .and_then(|real_load| match plan(&OPTIONS, session_options)? {
                    None => Ok(request.load_locally(real_load)),
                    Some(redirect) => {
                        log_redirect(&redirect, "SavedModel session");
                        saved_model::load_on_server(&request, real_load, &redirect)
                    }
                });
            match result {
                Ok(session) => session,
                Err(refusal) => {
                    refuse(status, &refusal);
                    std::ptr::null_mut()
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_fallback_value_not_an_unwind() {
        // No TensorFlow in the test process: the status is null and nothing is set.
        let got = boundary("test", std::ptr::null_mut(), 7, || -> i32 {
            panic!("boom")
        });
        assert_eq!(got, 7);
        assert_eq!(boundary("test", std::ptr::null_mut(), 7, || 1), 1);
        quiet_boundary("test", || panic!("boom"));
    }

    #[test]
    fn without_tensorflow_the_exports_fail_softly() {
        // SAFETY: null arguments; TensorFlow is absent, so each call reports and returns.
        unsafe {
            assert!(TF_NewSessionOptions().is_null());
            TF_DeleteSessionOptions(std::ptr::null_mut());
            TF_SetTarget(std::ptr::null_mut(), c"grpc://h:1".as_ptr());
            TF_SetConfig(
                std::ptr::null_mut(),
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
            );
            assert!(
                TF_NewSession(std::ptr::null_mut(), std::ptr::null(), std::ptr::null_mut())
                    .is_null()
            );
        }
    }
}
