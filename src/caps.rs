//! Names the capability a permission error points to, when this process lacks it.

use rustix::io::Errno;

use crate::error::Op;

/// A capability the volprep container adds back after `drop: [ALL]`, and what fails without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// The name Kubernetes uses in `capabilities.add` (without `CAP_`).
    pub name: &'static str,
    /// The bit in the kernel's capability sets (linux/capability.h).
    pub bit: u32,
    /// What fails without it.
    pub needed_for: &'static str,
}

pub const CHOWN: Cap = Cap { name: "CHOWN", bit: 0, needed_for: "chown of entries fails" };
pub const DAC_OVERRIDE: Cap = Cap {
    name: "DAC_OVERRIDE",
    bit: 1,
    needed_for: "entering other users' private directories and writing the marker on the root fail",
};
pub const FOWNER: Cap = Cap { name: "FOWNER", bit: 3, needed_for: "chmod of entries owned by other users fails" };
pub const FSETID: Cap = Cap {
    name: "FSETID",
    bit: 4,
    needed_for: "the kernel drops the setgid bit a directory (or a setgid file) of another group must have",
};

/// The capabilities that could have made a failed `op` with `errno` succeed, most likely first.
pub fn candidates(op: Op, errno: Option<Errno>) -> &'static [Cap] {
    let Some(errno) = errno else { return &[] };
    match (op, errno) {
        (Op::Chown, Errno::PERM) => &[CHOWN],
        (Op::Chmod, Errno::PERM) => &[FOWNER, FSETID],
        (Op::Open | Op::Readdir | Op::Stat | Op::Mkdir, Errno::ACCESS) => &[DAC_OVERRIDE],
        (Op::Xattr, Errno::ACCESS | Errno::PERM) => &[DAC_OVERRIDE, FOWNER],
        _ => &[],
    }
}

/// The effective capability set of this process (`CapEff` in /proc/self/status), if readable.
pub fn effective() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// The capabilities missing from `effective` that the failed operations (op, errno) point to,
/// each once, in the order the failures name them.
pub fn missing(failures: impl IntoIterator<Item = (Op, Option<Errno>)>, effective: u64) -> Vec<Cap> {
    let mut out: Vec<Cap> = Vec::new();
    for (op, errno) in failures {
        // The first candidate the process lacks explains the failure; one it holds does not.
        if let Some(cap) = candidates(op, errno).iter().find(|c| effective & (1u64 << c.bit) == 0) {
            if !out.contains(cap) {
                out.push(*cap);
            }
        }
    }
    out
}

/// The one line that names a missing capability.
pub fn message(cap: &Cap) -> String {
    format!(
        "missing capability CAP_{}: {}; add {} to the container's securityContext.capabilities.add",
        cap.name, cap.needed_for, cap.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: u64 = (1 << 41) - 1;
    const P: Option<Errno> = Some(Errno::PERM);
    const A: Option<Errno> = Some(Errno::ACCESS);

    #[test]
    fn a_refused_chmod_names_fowner_when_it_is_missing() {
        let eff = ALL & !(1 << FOWNER.bit);
        assert_eq!(missing([(Op::Chmod, P), (Op::Chmod, P)], eff), vec![FOWNER]);
    }

    #[test]
    fn a_refused_chmod_names_fsetid_when_fowner_is_there() {
        let eff = ALL & !(1 << FSETID.bit);
        assert_eq!(missing([(Op::Chmod, P)], eff), vec![FSETID]);
    }

    #[test]
    fn each_failure_maps_to_its_capability() {
        assert_eq!(missing([(Op::Chown, P)], 0), vec![CHOWN]);
        assert_eq!(missing([(Op::Open, A), (Op::Xattr, A)], 0), vec![DAC_OVERRIDE]);
    }

    #[test]
    fn nothing_is_named_when_every_capability_is_held_or_the_error_is_another() {
        assert!(missing([(Op::Chmod, P), (Op::Chown, P)], ALL).is_empty());
        assert!(
            missing([(Op::Chown, Some(Errno::ROFS)), (Op::Open, Some(Errno::IO)), (Op::Chown, None)], 0).is_empty()
        );
    }

    #[test]
    fn the_message_names_the_capability() {
        let m = message(&FOWNER);
        assert!(m.starts_with("missing capability CAP_FOWNER: "), "{m}");
        assert!(!m.contains('\n'));
    }
}
