//! The `salus` binary links no TensorFlow: an admin's machine (or a login
//! node) runs it without TensorFlow's libraries. Read from the built ELF's
//! DT_NEEDED entries, so that a dependency pulling in tensorflow-sys (or the
//! server crate) fails here.

use std::convert::TryInto;

fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap()) as usize
}
fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
}
fn u64_at(b: &[u8], at: usize) -> usize {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize
}

/// The DT_NEEDED library names of a little-endian ELF64 file.
fn needed_libraries(elf: &[u8]) -> Vec<String> {
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(elf[4], 2, "not ELF64");
    assert_eq!(elf[5], 1, "not little-endian");
    let (shoff, shentsize, shnum) = (u64_at(elf, 0x28), u16_at(elf, 0x3a), u16_at(elf, 0x3c));
    let section = |i: usize| {
        let h = shoff + i * shentsize;
        // (type, offset, size, link)
        (
            u32_at(elf, h + 4),
            u64_at(elf, h + 0x18),
            u64_at(elf, h + 0x20),
            u32_at(elf, h + 0x28),
        )
    };
    const SHT_DYNAMIC: usize = 6;
    const DT_NEEDED: usize = 1;
    let Some((_, offset, size, link)) = (0..shnum).map(section).find(|s| s.0 == SHT_DYNAMIC) else {
        return Vec::new(); // statically linked
    };
    let (_, strtab, _, _) = section(link);
    let mut names = Vec::new();
    for entry in (offset..offset + size).step_by(16) {
        let (tag, value) = (u64_at(elf, entry), u64_at(elf, entry + 8));
        if tag == DT_NEEDED {
            let start = strtab + value;
            let end = start + elf[start..].iter().position(|&c| c == 0).unwrap();
            names.push(String::from_utf8_lossy(&elf[start..end]).into_owned());
        }
    }
    names
}

#[test]
fn the_salus_binary_needs_no_tensorflow_library() {
    let path = env!("CARGO_BIN_EXE_salus");
    let elf = std::fs::read(path).unwrap();
    let needed = needed_libraries(&elf);
    assert!(
        needed.iter().any(|n| n.starts_with("libc.so")),
        "{needed:?}"
    );
    let tensorflow: Vec<_> = needed
        .iter()
        .filter(|n| n.to_lowercase().contains("tensorflow"))
        .collect();
    assert!(
        tensorflow.is_empty(),
        "{path} links {tensorflow:?}: salus-cli must not depend on tensorflow-sys or salus-server"
    );
}
