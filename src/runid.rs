//! Run ids (time, pid and host of the run that wrote a marker or a heartbeat): the [`RunId`]
//! type, valid by construction, and whether such a run is known to be dead.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::process::{Pid, test_kill_process};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::escape::escape_bytes;

/// The id of one run: unique enough to tell runs apart (time, pid and host), short enough for
/// the marker. Read back from the root (an xattr the app may write), it is checked once, where
/// it is decoded: a value of this type is always one volprep could have written (1 to 100
/// printable ASCII characters, no space, quote or backslash), so it can be carried into a new
/// marker and logged as it is. `Display` escapes all the same (see `escape`). On the wire it is
/// the plain string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunId(String);

/// A string that is not a run id volprep writes (see [`RunId`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotARunId(pub String);

impl fmt::Display for NotARunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a run id volprep does not write: '{}'", escape_bytes(self.0.as_bytes()))
    }
}

impl RunId {
    /// A new id for this run: `<µs since the epoch, hex>-<pid>@<host>`.
    pub fn new() -> Self {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let id = format!("{:x}-{}@{}", (nanos / 1000) as u64 & 0xffff_ffff_ffff, std::process::id(), hostname());
        RunId::parse(id).expect("a new run id is valid")
    }

    /// `id` as a run id, if it is one volprep could have written ([`RunId::new`], or one of an
    /// earlier version).
    pub fn parse(id: impl Into<String>) -> Result<Self, NotARunId> {
        let id = id.into();
        let valid = (1..=100).contains(&id.len())
            && id.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'\''));
        if valid { Ok(RunId(id)) } else { Err(NotARunId(id)) }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The pid and host of this run (`<time>-<pid>@<host>`). Only a positive pid is one (0 and
    /// negative numbers name process groups to `kill`).
    fn pid_and_host(&self) -> Option<(Pid, &str)> {
        let (head, host) = self.0.split_once('@')?;
        let raw = head.split_once('-')?.1.parse::<i32>().ok().filter(|&p| p > 0)?;
        Some((Pid::from_raw(raw)?, host))
    }

    /// Whether this run is known to be dead: it ran on this host and its process is gone, or it
    /// had this very pid (a restarted container, where volprep is pid 1 again).
    pub fn is_dead_here(&self) -> bool {
        let Some((pid, host)) = self.pid_and_host() else { return false };
        if host != hostname() {
            return false;
        }
        if pid.as_raw_nonzero().get() as u32 == std::process::id() {
            return true;
        }
        // Signal 0 only checks that the process exists.
        test_kill_process(pid) == Err(rustix::io::Errno::SRCH)
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&escape_bytes(self.0.as_bytes()))
    }
}

impl Serialize for RunId {
    fn serialize<S: Serializer>(&self, to: S) -> Result<S::Ok, S::Error> {
        to.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RunId {
    fn deserialize<D: Deserializer<'de>>(from: D) -> Result<Self, D::Error> {
        RunId::parse(String::deserialize(from)?).map_err(serde::de::Error::custom)
    }
}

/// This machine's (or pod's) host name, or "-", as it goes into a run id: at most 63
/// characters, each not in `[A-Za-z0-9._-]` replaced by `_`.
pub fn hostname() -> String {
    let safe = |c: char| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' };
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "-".into(), |h| h.trim().chars().take(63).map(safe).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> RunId {
        RunId::parse(s).unwrap()
    }

    #[test]
    fn a_new_run_id_is_valid_and_names_this_process() {
        let id = RunId::new();
        assert_eq!(RunId::parse(id.as_str()), Ok(id.clone()));
        let (pid, host) = id.pid_and_host().unwrap();
        assert_eq!((pid.as_raw_nonzero().get() as u32, host), (std::process::id(), hostname().as_str()));
        assert!(id.is_dead_here(), "a run of this very pid is an earlier life of this container");
    }

    #[test]
    fn a_forged_pid_is_never_probed() {
        let host = hostname();
        for pid in ["0", "-1", "-2", "-0", "x", "", "99999999999"] {
            let id = id(&format!("abc-{pid}@{host}"));
            assert_eq!(id.pid_and_host(), None, "{id}");
            assert!(!id.is_dead_here(), "{id}: neither alive nor dead, never probed");
        }
        assert!(id("abc-7@h").pid_and_host().is_some());
        assert!(!id(&format!("abc-1@{host}x")).is_dead_here(), "another host is never known dead");
        assert!(!id(&format!("abc-1@{host}")).is_dead_here(), "pid 1 is alive");
    }

    /// What the app could write into a marker and a log line would show wrongly (what earlier
    /// versions had to escape at every log site) is no run id at all.
    #[test]
    fn what_needs_escaping_is_no_run_id() {
        let forged = [
            "",
            "r\u{2028}FAKE",
            "r\u{e0041}",
            "r\u{200b}",
            "r\u{202e}x",
            "r\u{a0}",
            "a b",
            "r\nx",
            "r\tx",
            "r\\x",
            "r\"x",
            "r'x",
            "r\u{7f}",
            "\u{e9}t\u{e9}",
        ];
        for bad in forged.iter().map(|s| s.to_string()).chain(["r".repeat(101)]) {
            let e = RunId::parse(bad.as_str()).unwrap_err();
            assert_eq!(e, NotARunId(bad.clone()));
            let text = e.to_string();
            assert!(text.starts_with("a run id volprep does not write: '"), "{text}");
            let raw =
                |c: char| c.is_control() || ['\u{2028}', '\u{e0041}', '\u{200b}', '\u{202e}', '\u{a0}'].contains(&c);
            assert!(!text.chars().any(raw), "{bad:?} shown raw: {text:?}");
            let json = serde_json::to_string(&bad).unwrap();
            assert!(serde_json::from_str::<RunId>(&json).is_err(), "{bad:?} decoded");
        }
        for good in ["r1", "61b8369b5344-4f53@atlantis-0", "a-b@c_d.e", &"r".repeat(100)] {
            assert_eq!(id(good).as_str(), good);
        }
    }

    #[test]
    fn it_shows_and_travels_as_the_plain_string() {
        let id = id("61b8369b5344-4f53@atlantis-0");
        assert_eq!(id.to_string(), "61b8369b5344-4f53@atlantis-0");
        assert_eq!(format!("run {id}"), "run 61b8369b5344-4f53@atlantis-0");
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, r#""61b8369b5344-4f53@atlantis-0""#);
        assert_eq!(serde_json::from_str::<RunId>(&json).unwrap(), id);
    }
}
