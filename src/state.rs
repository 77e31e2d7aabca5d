//! States reports and logs spell as words (the marker's state, the signal that stopped a pass):
//! enums in the program, words only in serde and `Display`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What the marker on a volume's root said (`marker_before`) or says (`marker_after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MarkerState {
    /// Not known: the volume failed before its marker was read (reports spell it `""`).
    #[default]
    #[serde(rename = "")]
    Unknown,
    /// No marker.
    None,
    /// The filesystem has no user xattrs.
    Unsupported,
    /// Present but not a marker volprep can read.
    Unreadable,
    Done,
    InProgress,
}

impl MarkerState {
    /// The word reports and logs use: `none`, `done`, `in-progress`, `unsupported`,
    /// `unreadable` (`""` when not known).
    pub fn name(self) -> &'static str {
        match self {
            MarkerState::Unknown => "",
            MarkerState::None => "none",
            MarkerState::Unsupported => "unsupported",
            MarkerState::Unreadable => "unreadable",
            MarkerState::Done => "done",
            MarkerState::InProgress => "in-progress",
        }
    }
}

impl fmt::Display for MarkerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The signal that asked this process to stop: the walk stops, the state is saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stop {
    #[serde(rename = "SIGINT")]
    Int,
    #[serde(rename = "SIGTERM")]
    Term,
}

impl Stop {
    /// `SIGINT`, `SIGTERM`.
    pub fn name(self) -> &'static str {
        match self {
            Stop::Int => "SIGINT",
            Stop::Term => "SIGTERM",
        }
    }
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_the_wire_strings() {
        for s in [
            MarkerState::Unknown,
            MarkerState::None,
            MarkerState::Unsupported,
            MarkerState::Unreadable,
            MarkerState::Done,
            MarkerState::InProgress,
        ] {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{s}\""));
            assert_eq!(serde_json::from_str::<MarkerState>(&json).unwrap(), s);
        }
        assert_eq!(MarkerState::InProgress.to_string(), "in-progress");
        for (s, w) in [(Stop::Int, "SIGINT"), (Stop::Term, "SIGTERM")] {
            assert_eq!((s.to_string(), serde_json::to_string(&s).unwrap()), (w.to_string(), format!("\"{w}\"")));
        }
    }
}
