//! Unix user names to uids (`token issue --uid NAME`), without the server's crate.

use std::ffi::CString;

/// The uid of user `name` on this machine (getpwnam_r), if there is one.
pub fn uid_by_name(name: &str) -> Option<u32> {
    let name = CString::new(name).ok()?;
    let mut buffer = vec![0 as libc::c_char; 1024];
    loop {
        // SAFETY: an all-zero passwd is a valid value for getpwnam_r to fill.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; `buffer` holds `len` bytes.
        let status = unsafe {
            libc::getpwnam_r(
                name.as_ptr(),
                &mut entry,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut found,
            )
        };
        if status == libc::ERANGE && buffer.len() < 1 << 20 {
            buffer.resize(buffer.len() * 2, 0);
            continue;
        }
        return (status == 0 && !found.is_null()).then_some(entry.pw_uid);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn root_is_uid_0_and_unknown_names_are_none() {
        assert_eq!(super::uid_by_name("root"), Some(0));
        assert_eq!(super::uid_by_name("no-such-user-here"), None);
        assert_eq!(super::uid_by_name("nul\0inside"), None);
    }
}
