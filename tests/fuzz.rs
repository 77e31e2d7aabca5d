//! The mutation fuzzer: random trees, passes interrupted at random points (the binary's
//! `VOLPREP_TEST_KILL_AFTER` hook, SIGKILL and SIGTERM; SIGTERM sent while a `--max-ops`
//! ceiling makes the walk wait), passes held at a random point while a tmpfs is mounted over a
//! directory or a nested mount goes away, rounds with the load gate on (`--load adaptive`,
//! `--max-ops`, both), random changes between runs (renames
//! across and within parents, RENAME_EXCHANGE, mkdir+mv, file create/unlink, hardlink+unlink, a
//! directory replaced by a symlink; nested mounts appearing and going away: a tmpfs, a bind
//! mount of a directory or of a file; btrfs subvolumes created, snapshotted and deleted), reruns
//! plain, `--verify full` and sharded in random interleavings, with a spec that varies between
//! rounds (`--fs-group` alone or with `--owner`, read-only, `--sticky`), on tmpfs, ext4, btrfs
//! and an overlayfs volume whose layers lie on two filesystems. The property: whenever the
//! marker says `done`, `volprep check` exits 0, every entry conforms, and nothing outside the
//! volume changed; and every run ends as a run may (done, killed at its kill point, or the
//! documented exit of a special bit a SIGKILL cleared): any other exit, or an internal error,
//! fails the round.
//!
//! CI runs 500 rounds from a fixed seed and asserts a minimum count of each mutation and kill
//! kind (the summary shows them). Locally: `VOLPREP_FUZZ_SEED=<n>` another seed,
//! `VOLPREP_FUZZ_ROUNDS=<n>` more rounds, `VOLPREP_FUZZ_SECS=<n>` rounds until that many
//! seconds have passed, `VOLPREP_FUZZ_ROUND=<r>` replays one round (it prints what it does). A
//! failing round prints the seed, round, tree, kill points and mutations; each case it found is
//! a named test in tests/fuzz_regressions.rs.

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::clones::Clones;
use common::kill::{KillOnDrop, wait_within};
use common::mounts::{sh, try_sh};
use common::snap::conforms;
use common::tree::Rng;
use common::xattr::{MARKER, xattr_json};
use common::*;

const GID: u32 = 2000;
const DEFAULT_SEED: u64 = 0x0076_6f6c_7072_6570;
const DEFAULT_ROUNDS: u64 = 500;

/// Every change between two runs the fuzzer makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mutation {
    /// `mv D P/new` (P not D's parent, not below D).
    MvAcross,
    /// `mv D D.parent/new`.
    MvWithin,
    /// `renameat2(A, B, RENAME_EXCHANGE)` of two directories, neither below the other.
    Exchange,
    /// `mkdir P/new; mv D P/new/`.
    MkdirMv,
    /// A new root-owned 0600 file.
    Create,
    /// `rm F`.
    Unlink,
    /// `ln F P/new; rm F`.
    HardlinkUnlink,
    /// `mv D P/new; ln -s OUTSIDE D`.
    DirToSymlink,
    /// Clone rounds: both nested filesystems unmounted, their loop devices swapped, mounted
    /// again at their places (each clone now has the other's device number).
    Remount,
    /// A tmpfs (holding a root-owned file) mounted over a directory of the volume, hiding it.
    MountTmpfs,
    /// A directory outside the volume bind-mounted over one of the volume.
    BindDir,
    /// A file outside the volume bind-mounted over a file of the volume.
    BindFile,
    /// The latest nested mount unmounted: what it hid shows again.
    Unmount,
    /// The same, after the volume was marked done (then every shard runs again).
    UnmountAfterDone,
    /// btrfs rounds: `btrfs subvolume create` (with a root-owned file and directory in it).
    SubvolCreate,
    /// btrfs rounds: `btrfs subvolume snapshot` of a subvolume of the volume.
    SubvolSnapshot,
    /// btrfs rounds: `btrfs subvolume delete`.
    SubvolDelete,
    /// While a pass is held at a random point of its walk: a tmpfs mounted over a directory.
    MountDuring,
    /// While a pass is held at a random point of its walk: the latest nested mount unmounted.
    UnmountDuring,
}

/// The mutations made while a pass runs (see [`Round::held_run`]).
const DURING: &[Mutation] = &[Mutation::MountDuring, Mutation::UnmountDuring];

/// The load gate of a round's runs: `--load adaptive`, `--max-ops`, both, or neither.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Gate {
    #[default]
    Off,
    Adaptive,
    MaxOps,
    AdaptiveMaxOps,
}

/// The ceiling of `--max-ops` rounds: slow enough that the walk waits in the gate most of the
/// time, fast enough for the rounds of a CI run.
const MAX_OPS: &str = "6000";

impl Gate {
    fn random(rng: &mut Rng) -> Gate {
        match rng.below(12) {
            0 => Gate::Adaptive,
            1 => Gate::MaxOps,
            2 => Gate::AdaptiveMaxOps,
            _ => Gate::Off,
        }
    }

    fn args(self) -> Vec<&'static str> {
        match self {
            Gate::Off => vec![],
            Gate::Adaptive => vec!["--load", "adaptive"],
            Gate::MaxOps => vec!["--max-ops", MAX_OPS],
            Gate::AdaptiveMaxOps => vec!["--load", "adaptive", "--max-ops", MAX_OPS],
        }
    }

    fn ceiling(self) -> bool {
        matches!(self, Gate::MaxOps | Gate::AdaptiveMaxOps)
    }
}

const MUTATIONS: &[Mutation] = &[
    Mutation::MvAcross,
    Mutation::MvWithin,
    Mutation::Exchange,
    Mutation::MkdirMv,
    Mutation::Create,
    Mutation::Unlink,
    Mutation::HardlinkUnlink,
    Mutation::DirToSymlink,
    Mutation::MountTmpfs,
    Mutation::BindDir,
    Mutation::BindFile,
    Mutation::Unmount,
];

/// What btrfs rounds add to [`MUTATIONS`].
const BTRFS_MUTATIONS: &[Mutation] = &[Mutation::SubvolCreate, Mutation::SubvolSnapshot, Mutation::SubvolDelete];

/// The least of each mutation kind a CI run (the default seed and rounds) makes (the summary
/// shows them): a catalogue entry the fuzzer stops reaching fails it.
const MIN_EACH_MUTATION: u64 = 8;
/// The least of each kill kind (SIGKILL, SIGTERM at the kill point) and of runs that finished
/// before it, per CI run.
const MIN_EACH_KILL: u64 = 100;
/// The least SIGTERMs sent while a `--max-ops` ceiling makes the walk wait, per CI run.
const MIN_GATED_TERM: u64 = 15;
/// The least rounds of each base (tmpfs, ext4, btrfs, overlay) and of each spec, per CI run.
const MIN_EACH_ROUND_KIND: u64 = 15;

/// What a round's volume is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Base {
    Tmpfs,
    Ext4,
    Btrfs,
    /// An overlayfs volume: lower layer on a tmpfs, upper on ext4 (lower files have the tmpfs's
    /// device number on the overlay's mount).
    Overlay,
}

/// The app's uid of the app-safe rounds: one of the trees' owners, and `--owner`'s.
const APP_UID: u32 = 1000;

/// The spec of a round: `--fs-group 2000`, maybe with an owner, read-only, a sticky temp dir.
#[derive(Clone, Copy, Debug, Default)]
struct RoundSpec {
    owner: Option<u32>,
    read_only: bool,
    /// `--sticky VOL/tmp` on every `apply` (unsharded rounds).
    sticky: bool,
    /// `--modes app-safe --app-uid 1000` (the trees' names are `eN`: no app-private path, so the
    /// rule is "an entry of uid 1000 with no group or other bits keeps its mode; every other
    /// entry gets the kubelet's bits").
    app_safe: bool,
}

impl RoundSpec {
    fn random(rng: &mut Rng, sharded: bool) -> RoundSpec {
        RoundSpec {
            owner: (rng.below(4) == 0).then_some(1000),
            read_only: rng.below(4) == 0,
            sticky: !sharded && rng.below(4) == 0,
            app_safe: rng.below(4) == 0,
        }
    }

    /// The spec flags, for `apply` and `check` alike.
    fn args(&self) -> Vec<String> {
        let mut a = vec!["--fs-group".to_string(), GID.to_string()];
        if let Some(uid) = self.owner {
            a.extend(["--owner".to_string(), uid.to_string()]);
        }
        if self.read_only {
            a.push("--read-only".into());
        }
        if self.app_safe {
            a.extend(["--modes".to_string(), "app-safe".to_string(), "--app-uid".to_string(), APP_UID.to_string()]);
        }
        a
    }

    fn name(&self) -> String {
        let mut n = vec!["fs-group"];
        if self.owner.is_some() {
            n.push("owner");
        }
        if self.read_only {
            n.push("read-only");
        }
        if self.sticky {
            n.push("sticky");
        }
        if self.app_safe {
            n.push("app-safe");
        }
        n.join("+")
    }

    /// Whether the entry at `path` is as this spec wants it. App-safe: an entry the app does not
    /// own (after --owner) has the kubelet's bits, exactly (nothing removed, the group keeps its
    /// access, whatever names were planted or linked); the app's own has the group, and the
    /// kubelet's bits, a private mode kept, or a tightening where an app path may be (a name of
    /// the table, a file in `.ssh/`, a directory). `check` exiting 0 is the exact oracle.
    fn conforms(&self, path: &[u8], m: &Meta) -> bool {
        let app = self.owner.unwrap_or(m.uid) == APP_UID;
        let kubelet = conforms(m, GID, self.read_only);
        let mode = if self.app_safe && app && m.kind != Kind::Symlink {
            m.gid == GID && (kubelet || m.mode & 0o077 == 0 || m.kind == Kind::Dir || at_app_name(path))
        } else {
            kubelet
        };
        mode && self.owner.is_none_or(|u| m.uid == u)
    }
}

/// How a run of `apply` is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum RunKind {
    Plain,
    VerifyFull,
    /// `--shard I/N`.
    Shard,
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Sigkill,
    Sigterm,
    /// Exited 0 before its kill point.
    Finished,
    /// Any other exit code (counted, shown).
    Exit(i32),
}

/// Shape of a round's volume.
#[derive(Clone, Copy, Debug)]
struct Sharding {
    n: u32,
    depth: u32,
}

/// Totals over all rounds (the summary line).
#[derive(Default)]
struct Stats {
    rounds: u64,
    clone_rounds: u64,
    bases: BTreeMap<String, u64>,
    specs: BTreeMap<String, u64>,
    mutations: BTreeMap<String, u64>,
    kills: BTreeMap<String, u64>,
    gates: BTreeMap<String, u64>,
    reruns: BTreeMap<String, u64>,
    done_checked: u64,
    wrong_done: u64,
    outside_changed: u64,
    /// Rounds with a file of outside the volume hard-linked into it under an app path's name.
    linked_from_outside: u64,
    never_done: u64,
    unexpected_exits: u64,
    failures: Vec<String>,
}

fn bump(m: &mut BTreeMap<String, u64>, k: impl std::fmt::Debug) {
    *m.entry(key(k)).or_default() += 1;
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={v}: {e}")))
}

/// To the process's stderr (libtest captures `eprintln!` of passing tests).
fn say(s: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{s}");
}

/// The seed of round `r`: the same whether the round runs in a sequence or alone.
fn round_seed(seed: u64, r: u64) -> u64 {
    let mut rng = Rng::new(seed ^ r.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    rng.next_u64()
}

#[test]
#[ignore = "needs root, loop devices, mkfs.ext4, mkfs.btrfs, btrfs and --features test-hooks"]
fn mutation_fuzz_done_means_every_entry_conforms() {
    privileged(&["mkfs.ext4", "mkfs.btrfs", "btrfs"]);
    let seed = env_u64("VOLPREP_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let only = env_u64("VOLPREP_FUZZ_ROUND");
    let secs = env_u64("VOLPREP_FUZZ_SECS");
    let custom = env_u64("VOLPREP_FUZZ_ROUNDS");
    let rounds = custom.unwrap_or(if secs.is_some() { u64::MAX } else { DEFAULT_ROUNDS });
    let tmpfs = Tmpfs::new();
    let ext4 = LoopFs::with_mkfs_args(FsKind::Ext4, 256, &["-N", "60000"]);
    let btrfs = LoopFs::new(FsKind::Btrfs, 256);
    let start = Instant::now();
    let mut stats = Stats::default();
    let range: Box<dyn Iterator<Item = u64>> = match only {
        Some(r) => Box::new(r..=r),
        None => Box::new(0..rounds),
    };
    for r in range {
        if secs.is_some_and(|s| start.elapsed() > Duration::from_secs(s)) {
            break;
        }
        let base = match r % 10 {
            4 | 9 => Base::Ext4,
            2 => Base::Btrfs,
            6 if r % 20 == 6 => Base::Overlay,
            _ => Base::Tmpfs,
        };
        let fs = match base {
            Base::Ext4 | Base::Overlay => ext4.path(),
            Base::Btrfs => btrfs.path(),
            Base::Tmpfs => tmpfs.path(),
        };
        let mut round = Round::new(seed, r, fs.join(format!("r{r}")), base, only.is_some());
        round.with_clones = r % 10 == 7;
        round.play(&mut stats);
        round.clean_up();
    }
    let summary = summary(seed, &stats, start.elapsed());
    say(&summary);
    if let Ok(out) = std::env::var("VOLPREP_FUZZ_SUMMARY") {
        std::fs::write(out, format!("{summary}\n")).expect("write the summary");
    }
    assert!(
        stats.failures.is_empty(),
        "{} failing round(s):\n{}\n{summary}",
        stats.failures.len(),
        stats.failures.join("\n\n")
    );
    if only.is_none() && secs.is_none() && custom.is_none() {
        assert!(stats.rounds >= DEFAULT_ROUNDS, "{summary}");
        let short = too_few(&stats);
        assert!(short.is_empty(), "the catalogue was not covered: {}\n{summary}", short.join(", "));
    }
}

/// The kinds a CI run made fewer of than its minimum.
fn too_few(s: &Stats) -> Vec<String> {
    let mut short = Vec::new();
    let mut need = |m: &BTreeMap<String, u64>, kind: String, min: u64| {
        let n = m.get(&kind).copied().unwrap_or(0);
        if n < min {
            short.push(format!("{kind}={n} (at least {min})"));
        }
    };
    for k in
        MUTATIONS.iter().chain(BTRFS_MUTATIONS).chain(DURING).chain([&Mutation::Remount, &Mutation::UnmountAfterDone])
    {
        need(&s.mutations, key(k), MIN_EACH_MUTATION);
    }
    for k in [End::Sigkill, End::Sigterm, End::Finished] {
        need(&s.kills, key(k), MIN_EACH_KILL);
    }
    need(&s.kills, "sigterm_in_gate".into(), MIN_GATED_TERM);
    for g in [Gate::Adaptive, Gate::MaxOps, Gate::AdaptiveMaxOps] {
        need(&s.gates, key(g), MIN_EACH_ROUND_KIND);
    }
    for b in [Base::Tmpfs, Base::Ext4, Base::Btrfs, Base::Overlay] {
        need(&s.bases, key(b), MIN_EACH_ROUND_KIND);
    }
    for spec in ["owner", "read-only", "sticky", "app-safe"] {
        let n: u64 = s.specs.iter().filter(|(k, _)| k.split('+').any(|w| w == spec)).map(|(_, v)| v).sum();
        if n < MIN_EACH_ROUND_KIND {
            short.push(format!("spec {spec}={n} (at least {MIN_EACH_ROUND_KIND})"));
        }
    }
    short
}

fn key(k: impl std::fmt::Debug) -> String {
    format!("{k:?}").to_lowercase()
}

fn summary(seed: u64, s: &Stats, elapsed: Duration) -> String {
    let list = |m: &BTreeMap<String, u64>| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
    format!(
        "fuzz summary: seed={seed:#x} rounds={} ({}; with nested ext4 clones {}) | specs: {} | load gates: {} | mutations: {} (total {}) | kills: {} | runs: {} | done checked={} wrong_done={} outside_changed={} linked_from_outside={} never_done={} unexpected_exits={} | minimums per CI run: each mutation {MIN_EACH_MUTATION} (mountduring and unmountduring: while a pass is held), each kill kind {MIN_EACH_KILL}, sigterm_in_gate {MIN_GATED_TERM}, each base, spec and load gate {MIN_EACH_ROUND_KIND} | {:.1}s",
        s.rounds,
        list(&s.bases),
        s.clone_rounds,
        list(&s.specs),
        list(&s.gates),
        list(&s.mutations),
        s.mutations.values().sum::<u64>(),
        list(&s.kills),
        list(&s.reruns),
        s.done_checked,
        s.wrong_done,
        s.outside_changed,
        s.linked_from_outside,
        s.never_done,
        s.unexpected_exits,
        elapsed.as_secs_f64()
    )
}

/// One round: its volume, the sentinel outside it, and what it did (for the failure message).
struct Round {
    seed: u64,
    index: u64,
    rng: Rng,
    dir: PathBuf,
    vol: PathBuf,
    outside: PathBuf,
    base: Base,
    spec: RoundSpec,
    /// The load gate of every `apply` of the round.
    gate: Gate,
    verbose: bool,
    sharding: Option<Sharding>,
    steps: Vec<String>,
    tree: String,
    counter: u32,
    /// Two ext4 clones mounted inside the volume, passes with `--cross-devices`.
    with_clones: bool,
    clones: Option<Clones>,
    /// Nested mounts inside the volume (relative path, the mount), the latest last.
    nested: Vec<(PathBuf, Box<dyn std::any::Any>)>,
    /// btrfs subvolumes made inside the volume (relative paths).
    subvols: Vec<PathBuf>,
    /// Overlay rounds: the overlay mounted at `vol` and its lower layer (a tmpfs), unmounted in
    /// that order.
    overlay: Option<(Overlay, Tmpfs)>,
    /// A run stopped on a setuid/setgid bit a SIGKILL cleared (exit 1, documented): the next run
    /// of the same shard (`Some(None)` unsharded) does what the message says, `--force`.
    force_next: Option<Option<u32>>,
}

impl Round {
    fn new(seed: u64, index: u64, dir: PathBuf, base: Base, verbose: bool) -> Round {
        let (vol, outside) = (dir.join("vol"), dir.join("outside"));
        Round {
            seed,
            index,
            rng: Rng::new(round_seed(seed, index)),
            dir,
            vol,
            outside,
            base,
            spec: RoundSpec::default(),
            gate: Gate::Off,
            verbose,
            sharding: None,
            steps: Vec::new(),
            tree: String::new(),
            counter: 0,
            with_clones: false,
            clones: None,
            nested: Vec::new(),
            subvols: Vec::new(),
            overlay: None,
            force_next: None,
        }
    }

    fn log(&mut self, s: String) {
        if self.verbose {
            say(&format!("round {}: {s}", self.index));
        }
        self.steps.push(s);
    }

    fn fresh(&mut self, stem: &str) -> String {
        self.counter += 1;
        format!("{stem}{}", self.counter)
    }

    /// Unmounts what the round mounted (the latest first) and removes its directory.
    fn clean_up(&mut self) {
        while self.nested.pop().is_some() {}
        self.clones = None;
        self.overlay = None;
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// Builds the round's tree: in the volume, or (overlay rounds) in a lower layer on a tmpfs
    /// under an overlay whose upper layer is beside the volume.
    fn build(&mut self, tree: &Tree) {
        if self.base != Base::Overlay {
            return tree.build(&self.vol);
        }
        let lower = Tmpfs::new();
        tree.build(&lower.path().join("t"));
        let (upper, work) = (self.dir.join("upper"), self.dir.join("work"));
        for d in [&upper, &work, &self.vol] {
            std::fs::create_dir_all(d).unwrap();
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.path().join("t").display(),
            upper.display(),
            work.display()
        );
        self.overlay = Some((Overlay::mount(&opts, &self.vol), lower));
    }

    fn play(&mut self, stats: &mut Stats) {
        stats.rounds += 1;
        bump(&mut stats.bases, self.base);
        let _ = std::fs::remove_dir_all(&self.dir);
        make_outside(&self.outside);
        let tree = random_tree(&mut self.rng, &self.outside);
        self.build(&tree);
        self.tree = describe_tree(&tree);
        if self.with_clones {
            let inner = random_tree(&mut self.rng, &self.outside);
            self.tree += &format!("\nm1 and m2 (ext4 clones of one image):\n{}", describe_tree(&inner));
            self.clones = Some(Clones::new(&self.vol, &inner));
            stats.clone_rounds += 1;
        }
        if self.base == Base::Btrfs {
            // A subvolume from the start, for snapshots and deletes to work on.
            let made = self.subvol_create(&[PathBuf::new()]);
            self.log(format!("set-up: {}", made.unwrap_or_default()));
        }
        let outside_before = snapshot(&self.outside);
        let linked = self.link_from_outside();
        stats.linked_from_outside += u64::from(linked.is_some());
        if !self.with_clones && self.rng.below(3) == 0 {
            self.sharding = Some(Sharding { n: 2 + self.rng.below(3) as u32, depth: 1 + self.rng.below(2) as u32 });
        }
        self.spec = RoundSpec::random(&mut self.rng, self.sharding.is_some());
        *stats.specs.entry(self.spec.name()).or_default() += 1;
        self.gate = Gate::random(&mut self.rng);
        bump(&mut stats.gates, self.gate);
        self.log(format!(
            "{} on {:?}: {} entries, sharding {:?}, spec {:?}, load gate {:?}",
            self.vol.display(),
            self.base,
            tree.len(),
            self.sharding,
            self.spec,
            self.gate
        ));
        let steps = 1 + self.rng.below(5);
        let mut done = false;
        for _ in 0..steps {
            let kill = self.rng.below(10) < 8;
            self.one_run(stats, kill, None);
            if self.marker_done() {
                done = true;
                self.check_done(stats);
                break;
            }
            for _ in 0..self.rng.below(4) {
                self.mutate(stats);
            }
        }
        if !done {
            done = self.until_done(stats);
        }
        // A nested mount going away after `done`: the next start must not skip what it hid.
        if done && !self.nested.is_empty() && self.rng.below(2) == 0 {
            let (rel, m) = self.nested.pop().expect("a nested mount");
            drop(m);
            bump(&mut stats.mutations, Mutation::UnmountAfterDone);
            self.log(format!("mutation UnmountAfterDone: umount {}", rel.display()));
            done = self.until_done(stats);
        }
        if !done {
            stats.never_done += 1;
            self.fail(stats, "never done: runs without kills or changes did not complete the volume".into());
        }
        if let Some((path, mode)) = linked {
            let now =
                std::fs::symlink_metadata(&path).map_or(mode, |m| std::os::unix::fs::MetadataExt::mode(&m) & 0o7777);
            if now & mode != mode {
                stats.outside_changed += 1;
                self.fail(
                    stats,
                    format!(
                        "a bit removed through a hard link, outside the volume: {} {mode:04o} -> {now:04o}",
                        path.display()
                    ),
                );
            }
        }
        let outside_after = snapshot(&self.outside);
        let diff = snap::diff(&outside_before, &outside_after, |m| m.attrs_ctime());
        if !diff.is_empty() {
            stats.outside_changed += 1;
            self.fail(stats, format!("changed outside the volume:\n{}", diff.join("\n")));
        }
    }

    /// Runs without kills or changes until the volume is done: every shard in turn, in a random
    /// order, each sweep; checks the property when it is. Returns whether it got done.
    fn until_done(&mut self, stats: &mut Stats) -> bool {
        for _ in 0..3 {
            let mut order: Vec<u32> = (0..self.sharding.map_or(1, |s| s.n)).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, self.rng.below(i + 1));
            }
            for shard in order {
                self.one_run(stats, false, Some(shard));
                if self.marker_done() {
                    self.check_done(stats);
                    return true;
                }
            }
        }
        false
    }

    /// The volume's entries: nested filesystems included in clone rounds (`--cross-devices`),
    /// else what is on the volume's mount (btrfs subvolumes, overlay layers' files included).
    fn snapshot(&self) -> Snapshot {
        snapshot_with(&self.vol, if self.with_clones { Mounts::Enter } else { Mounts::Volume })
    }

    /// Whether the marker claims the volume done now: `done`, and, when it recorded the mount
    /// points below the root (`mounts`), the same ones are there. A mount gone after the pass
    /// listed them (after its end, or in the instant between that list and the marker write)
    /// makes the next start walk: that marker claims nothing.
    fn marker_done(&self) -> bool {
        xattr_json(&self.vol, MARKER)
            .is_some_and(|m| m["state"] == "done" && m["mounts"].as_str().is_none_or(|d| d == mounts_digest(&self.vol)))
    }

    /// The property: `done` means `check` exits 0 and every entry conforms (and a sticky temp
    /// dir has its bits).
    fn check_done(&mut self, stats: &mut Stats) {
        stats.done_checked += 1;
        let mut cmd = volprep();
        cmd.arg("check").args(self.spec.args()).args(["--log-format", "text"]);
        if self.with_clones {
            cmd.arg("--cross-devices");
        }
        let c = run(cmd.arg(&self.vol));
        let snap = self.snapshot();
        // btrfs's stand-in of a subvolume a snapshot did not include: takes no change.
        let stand_in = |m: &Meta| self.base == Base::Btrfs && m.kind == Kind::Dir && m.ino == 2;
        let mut wrong: Vec<String> = snap
            .iter()
            .filter(|(k, m)| !self.spec.conforms(k, m) && !stand_in(m))
            .map(|(k, m)| format!("  {} {:?} {}:{} {:04o}", snap::show(k), m.kind, m.uid, m.gid, m.mode))
            .collect();
        if let Some(bad) = self.sticky_wrong() {
            wrong.push(bad);
        }
        if c.code != 0 || !wrong.is_empty() {
            stats.wrong_done += 1;
            let shown: Vec<&String> = wrong.iter().take(12).collect();
            let msg = format!(
                "WRONG DONE: marker `done` but check exits {} and {} entries do not conform:\n{}\ncheck stderr (tail):\n{}",
                c.code,
                wrong.len(),
                shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"),
                tail(&c.stderr, 6)
            );
            self.fail(stats, msg);
        }
    }

    /// Now and then (1 in 4, from a stream of its own), a file outside the volume (another
    /// subPath's, of the app's uid or another's) hard-linked into it under an app path's name:
    /// its path and mode. Whatever the pass, no bit of it may be removed through the link (the
    /// kubelet's rule and `--owner` change it, as they do every name of an inode: documented).
    fn link_from_outside(&mut self) -> Option<(PathBuf, u32)> {
        let mut rng = self.rng.fork(0x6c69_6e6b_6564);
        if rng.below(4) != 0 {
            return None;
        }
        let dir = self.dir.join("other-subpath");
        std::fs::create_dir_all(&dir).ok()?;
        let file = dir.join("shared.db");
        std::fs::write(&file, b"x").ok()?;
        let (uid, gid) = [(0, 0), (APP_UID, APP_UID), (3000, 3000)][rng.below(3)];
        let mode = [0o660, 0o640, 0o600, 0o664][rng.below(4)];
        std::os::unix::fs::lchown(&file, Some(uid), Some(gid)).ok()?;
        chmod(&file, mode);
        let name = [".erlang.cookie", "server.key", "pubring.kbx"][rng.below(3)];
        let at = self.vol.join(name);
        (!at.exists() && std::fs::hard_link(&file, &at).is_ok()).then(|| {
            self.log(format!("set-up: {name} hard-linked from outside ({uid}:{gid} {mode:04o})"));
            (file, mode)
        })
    }

    /// The `--sticky VOL/tmp` dir as `apply` left it, when it is wrong: read by its path, so
    /// across a mount on `tmp` (volprep makes the mount's root 1777, as it is what the path
    /// names); a symlink there is refused by volprep (documented, exit 1) and is not wrong.
    fn sticky_wrong(&self) -> Option<String> {
        if !self.spec.sticky {
            return None;
        }
        let tmp = std::fs::symlink_metadata(self.vol.join("tmp")).ok();
        let ok = tmp.as_ref().is_some_and(|m| {
            use std::os::unix::fs::PermissionsExt as _;
            m.file_type().is_symlink() || (m.is_dir() && m.permissions().mode() & 0o1777 == 0o1777)
        });
        (!ok).then(|| format!("  tmp (--sticky) {:?}", tmp.map(|m| (m.file_type(), m.permissions()))))
    }

    /// Whether `tmp` of the volume is a symlink now (a mutation made it one).
    fn sticky_is_symlink(&self) -> bool {
        self.spec.sticky && std::fs::symlink_metadata(self.vol.join("tmp")).is_ok_and(|m| m.file_type().is_symlink())
    }

    fn fail(&mut self, stats: &mut Stats, what: String) {
        let msg = format!(
            "round {} (replay: VOLPREP_FUZZ_SEED={:#x} VOLPREP_FUZZ_ROUND={}): {what}\nsteps:\n  {}\ntree:\n{}",
            self.index,
            self.seed,
            self.index,
            self.steps.join("\n  "),
            self.tree
        );
        say(&msg);
        stats.failures.push(msg);
    }

    /// One `apply` (a shard of it when the volume is sharded: `shard`, or a random one), maybe
    /// with a kill point. An exit other than the ones a run may have, or an internal error,
    /// fails the round.
    fn one_run(&mut self, stats: &mut Stats, kill: bool, shard: Option<u32>) {
        let threads = 1 + self.rng.below(3);
        let interval = ["0", "0", "0", "2ms", "3s"][self.rng.below(5)];
        let mut cmd = volprep();
        cmd.arg("apply").args(self.spec.args()).args(["--log-format", "text", "--progress-interval", "0"]).args([
            "--threads",
            &threads.to_string(),
            "--checkpoint-interval",
            interval,
        ]);
        // A `--force` due goes to the shard whose run asked for it (its checkpoint holds the record).
        let forced = self.force_next.flatten();
        let mut shard_run = None;
        let (kind, mut what) = match self.sharding {
            Some(s) => {
                let i = shard.or(forced).unwrap_or_else(|| self.rng.below(s.n as usize) as u32);
                shard_run = Some(i);
                cmd.arg(format!("--shard={i}/{}", s.n)).arg(format!("--shard-depth={}", s.depth));
                (RunKind::Shard, format!("apply --shard {i}/{} --shard-depth {}", s.n, s.depth))
            }
            None if self.rng.below(4) == 0 => {
                cmd.args(["--verify", "full"]);
                (RunKind::VerifyFull, "apply --verify full".to_string())
            }
            None => (RunKind::Plain, "apply".to_string()),
        };
        what += &format!(" {}", self.spec.args().join(" "));
        if self.sharding.is_some() && self.rng.below(5) == 0 {
            cmd.args(["--verify", "full"]);
            what += " --verify full";
        }
        if self.with_clones {
            cmd.arg("--cross-devices");
            what += " --cross-devices";
        }
        if self.spec.sticky {
            cmd.arg("--sticky").arg(self.vol.join("tmp"));
            what += " --sticky VOL/tmp";
        }
        if self.force_next.is_some_and(|f| f == shard_run) {
            self.force_next = None;
            cmd.arg("--force");
            what += " --force";
        }
        what += &format!(" -j {threads} --checkpoint-interval {interval}");
        cmd.args(self.gate.args());
        if self.gate != Gate::Off {
            what += &format!(" {}", self.gate.args().join(" "));
        }
        let interrupt = if kill { self.interrupt() } else { Interrupt::None };
        bump(&mut stats.reruns, kind);
        let (end, stderr) = self.run_interrupted(cmd, interrupt, &mut what, stats);
        let state = xattr_json(&self.vol, MARKER).map_or("none".to_string(), |m| m["state"].to_string());
        self.log(format!("{what} -> {end:?}, marker {state}"));
        // A SIGKILL between a setuid file's chown and chmod: the bit is not restored from the
        // app-writable root; the run exits 1 and says to chmod or run `--force` once.
        let cleared_bit = end == End::Exit(1) && stderr.contains("not restored automatically");
        if cleared_bit {
            self.force_next = Some(shard_run);
            *stats.reruns.entry("force_after_cleared_special_bit".into()).or_default() += 1;
        }
        if self.verbose {
            say(&format!("    stderr (tail):\n{}", tail(&stderr, 8)));
        }
        // `tmp` turned into a symlink: `--sticky` refuses it (exit 1, documented), the volume
        // is still prepared.
        let sticky_refused = end == End::Exit(1)
            && self.sticky_is_symlink()
            && stderr.contains("is a symlink; refusing to make its target a shared temp dir");
        if sticky_refused {
            *stats.reruns.entry("sticky_symlink_refused".into()).or_default() += 1;
        }
        let unexpected = match end {
            End::Finished => false,
            End::Sigkill | End::Sigterm => !kill || matches!(interrupt, Interrupt::At(_, "stop")),
            End::Exit(_) => !cleared_bit && !sticky_refused,
        };
        if unexpected || stderr.contains("internal error") {
            stats.unexpected_exits += 1;
            let code = match end {
                End::Exit(c) => format!("exit {c}"),
                other => format!("{other:?}"),
            };
            self.fail(stats, format!("UNEXPECTED END: {what} ended with {code}:\n{}", tail(&stderr, 8)));
        }
    }

    /// Runs `cmd` (the volume not yet named) as `interrupt` says, adding it to `what`; counts
    /// the kill kinds. A held run may start with a mount in place (for the hold to take away).
    fn run_interrupted(
        &mut self,
        mut cmd: Command,
        interrupt: Interrupt,
        what: &mut String,
        stats: &mut Stats,
    ) -> (End, String) {
        if let Interrupt::At(at, how) = interrupt {
            common::kill::hook(&mut cmd, "VOLPREP_TEST_KILL_AFTER", &format!("{at}:{how}"));
            *what += &format!(" [{} point {at}:{how}]", if how == "stop" { "hold" } else { "kill" });
        }
        if let Interrupt::TermAfter(ms) = interrupt {
            *what += &format!(" [SIGTERM after {ms} ms, in the gate]");
        }
        if matches!(interrupt, Interrupt::At(_, "stop")) {
            // Half the held runs start with a mount in place, for the hold to take it away: what
            // it hid was never walked, and no `done` may claim it.
            if self.nested.is_empty() && self.rng.below(2) == 0 {
                let (dirs, _) = self.list_tree();
                if let Some(m) = self.mount_tmpfs(&dirs) {
                    bump(&mut stats.mutations, Mutation::MountTmpfs);
                    self.log(format!("mutation MountTmpfs (before a held run): {m}"));
                }
            }
        }
        cmd.arg(&self.vol);
        let (end, stderr) = match interrupt {
            Interrupt::At(_, "stop") => self.held_run(cmd, stats),
            Interrupt::TermAfter(ms) => run_ending_term(cmd, ms),
            _ => run_ending(cmd),
        };
        let end = match (interrupt, end) {
            // SIGTERM before the handler was set: the default action, as a pod's would be.
            (Interrupt::TermAfter(_), End::Exit(-15)) => End::Sigterm,
            (_, end) => end,
        };
        match interrupt {
            Interrupt::At(_, "stop") | Interrupt::None => {}
            Interrupt::TermAfter(_) if end == End::Sigterm => {
                *stats.kills.entry("sigterm_in_gate".into()).or_default() += 1;
            }
            _ => bump(&mut stats.kills, end),
        }
        (end, stderr)
    }

    /// How a run with a kill point is interrupted: SIGKILL or SIGTERM at a random entry (as
    /// many as before), held there while a mount changes (about one run in five, none in clone
    /// rounds), or, in rounds with a `--max-ops` ceiling, a SIGTERM from outside at a random
    /// time, while the gate makes the walk wait.
    fn interrupt(&mut self) -> Interrupt {
        if self.gate.ceiling() && self.rng.below(3) == 0 {
            return Interrupt::TermAfter(20 + self.rng.below(120) as u64);
        }
        // A shard counts only its part: about 1/N of the entries.
        let entries = self.snapshot().len() as u64 * 2 / self.sharding.map_or(2, |s| s.n as u64);
        let at = 1 + self.rng.below(entries.max(1) as usize) as u64;
        if !self.with_clones && self.rng.below(5) == 0 {
            return Interrupt::At(at, "stop");
        }
        Interrupt::At(at, if self.rng.below(2) == 0 { "kill" } else { "term" })
    }

    /// Runs `cmd` (its hook set to stop it at its hold point), and when it stops there, mounts
    /// a tmpfs over a directory or unmounts the latest nested mount, then lets it go on. A run
    /// with fewer entries than its hold point just ends.
    fn held_run(&mut self, mut cmd: Command, stats: &mut Stats) -> (End, String) {
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let cmdline = format!("{cmd:?}");
        let mut child = KillOnDrop(cmd.spawn().expect("spawn volprep"));
        let pid = child.0.id();
        let deadline = Instant::now() + Duration::from_secs(120);
        let stopped = loop {
            if child.0.try_wait().unwrap().is_some() {
                break false;
            }
            if proc_state(pid) == Some('T') {
                break true;
            }
            assert!(Instant::now() < deadline, "never reached its hold point: {cmdline}");
            std::thread::sleep(Duration::from_millis(2));
        };
        if stopped {
            let m = if !self.nested.is_empty() && self.rng.below(3) > 0 {
                Mutation::UnmountDuring
            } else {
                Mutation::MountDuring
            };
            let (dirs, _) = self.list_tree();
            let done = match m {
                Mutation::UnmountDuring => self.unmount(),
                _ => self.mount_tmpfs(&dirs),
            };
            if let Some(what) = done {
                bump(&mut stats.mutations, m);
                self.log(format!("mutation {m:?} (the pass held): {what}"));
            }
        }
        // The hook fires once per walk: the run that completes a sharded volume walks other
        // parts after its own, and stops again there. Each stop after the first is let go at once.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let go_on = {
            let done = done.clone();
            std::thread::spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    if proc_state(pid) == Some('T') {
                        // SAFETY: kill takes plain integers.
                        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        let out = wait_within(child, Duration::from_secs(120), &cmdline);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        go_on.join().unwrap();
        ending(out)
    }

    fn mutate(&mut self, stats: &mut Stats) {
        let m = match self.clones {
            Some(_) if self.rng.below(3) == 0 => Mutation::Remount,
            _ if self.base == Base::Btrfs && self.rng.below(2) == 0 => {
                BTRFS_MUTATIONS[self.rng.below(BTRFS_MUTATIONS.len())]
            }
            _ => MUTATIONS[self.rng.below(MUTATIONS.len())],
        };
        let (dirs, files) = self.list_tree();
        let done = match m {
            Mutation::MvAcross => self.mv_across(&dirs),
            Mutation::MvWithin => self.mv_within(&dirs),
            Mutation::Exchange => self.exchange(&dirs),
            Mutation::MkdirMv => self.mkdir_mv(&dirs),
            Mutation::Create => self.create(&dirs),
            Mutation::Unlink => self.unlink(&files),
            Mutation::HardlinkUnlink => self.hardlink_unlink(&dirs, &files),
            Mutation::DirToSymlink => self.dir_to_symlink(&dirs),
            Mutation::Remount => self.clones.as_mut().map(Clones::remount_swapped),
            Mutation::MountTmpfs => self.mount_tmpfs(&dirs),
            Mutation::BindDir => self.bind_dir(&dirs),
            Mutation::BindFile => self.bind_file(&files),
            Mutation::Unmount => self.unmount(),
            Mutation::UnmountAfterDone | Mutation::MountDuring | Mutation::UnmountDuring => None,
            Mutation::SubvolCreate => self.subvol_create(&dirs),
            Mutation::SubvolSnapshot => self.subvol_snapshot(&dirs),
            Mutation::SubvolDelete => self.subvol_delete(),
        };
        if let Some(what) = done {
            bump(&mut stats.mutations, m);
            self.log(format!("mutation {m:?}: {what}"));
        }
    }

    /// Paths (relative) that renames must not move: nested mount points (their guards unmount
    /// them by path) and subvolumes (deleted by path).
    fn pinned(&self) -> Vec<PathBuf> {
        self.nested.iter().map(|(p, _)| p.clone()).chain(self.subvols.iter().cloned()).collect()
    }

    /// Directories (the root as "") and regular files of the volume, neither a nested mount
    /// point nor below one.
    fn list_tree(&self) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let mounts: Vec<&PathBuf> = self.nested.iter().map(|(p, _)| p).collect();
        let (dirs, files) = list_tree(&self.vol);
        let outside_mounts = |p: &PathBuf| !mounts.iter().any(|m| p.starts_with(m));
        (dirs.into_iter().filter(outside_mounts).collect(), files.into_iter().filter(outside_mounts).collect())
    }

    /// A directory of the volume holding no pinned path (a mount point, a subvolume).
    fn movable<'d>(&self, dirs: &'d [PathBuf]) -> Vec<&'d PathBuf> {
        let pinned = self.pinned();
        dirs.iter().filter(|d| !d.as_os_str().is_empty() && !pinned.iter().any(|p| p.starts_with(d))).collect()
    }

    /// A directory to mount over: not the root, holding no mount point nor subvolume (none in
    /// clone rounds, whose clones are unmounted and mounted again).
    fn mount_target(&mut self, dirs: &[PathBuf]) -> Option<PathBuf> {
        if self.with_clones {
            return None;
        }
        let targets = self.movable(dirs);
        targets.get(self.rng.below(targets.len().max(1))).map(|d| (*d).clone())
    }

    fn mount_tmpfs(&mut self, dirs: &[PathBuf]) -> Option<String> {
        let d = self.mount_target(dirs)?;
        let m = Tmpfs::at(&self.abs(&d));
        std::fs::write(self.abs(&d).join("on-tmpfs"), b"x").unwrap();
        self.nested.push((d.clone(), Box::new(m)));
        Some(format!("mount -t tmpfs t {}", d.display()))
    }

    fn bind_dir(&mut self, dirs: &[PathBuf]) -> Option<String> {
        let d = self.mount_target(dirs)?;
        let name = self.fresh("bind-src");
        let src = self.dir.join(name);
        std::fs::create_dir_all(src.join("sub")).unwrap();
        std::fs::write(src.join("sub/f"), b"x").unwrap();
        self.nested.push((d.clone(), Box::new(Bind::new(&src, &self.abs(&d)))));
        Some(format!("mount --bind DIR/{} {}", src.file_name().unwrap().to_string_lossy(), d.display()))
    }

    fn bind_file(&mut self, files: &[PathBuf]) -> Option<String> {
        if self.with_clones {
            return None;
        }
        let f = files.get(self.rng.below(files.len().max(1)))?.clone();
        let name = self.fresh("bind-file");
        let src = self.dir.join(name);
        std::fs::write(&src, b"x").unwrap();
        self.nested.push((f.clone(), Box::new(Bind::new(&src, &self.abs(&f)))));
        Some(format!("mount --bind FILE {}", f.display()))
    }

    fn unmount(&mut self) -> Option<String> {
        let (rel, m) = self.nested.pop()?;
        drop(m);
        Some(format!("umount {}", rel.display()))
    }

    fn subvol_create(&mut self, dirs: &[PathBuf]) -> Option<String> {
        let p = dirs.get(self.rng.below(dirs.len()))?.join(self.fresh("sv"));
        sh("btrfs", &["subvolume".as_ref(), "create".as_ref(), self.abs(&p).as_os_str()]);
        std::fs::create_dir(self.abs(&p).join("d")).unwrap();
        std::fs::write(self.abs(&p).join("d/f"), b"x").unwrap();
        chmod(&self.abs(&p).join("d/f"), 0o600);
        self.subvols.push(p.clone());
        Some(format!("btrfs subvolume create {} (with d/f)", p.display()))
    }

    fn subvol_snapshot(&mut self, dirs: &[PathBuf]) -> Option<String> {
        let from = self.subvols.get(self.rng.below(self.subvols.len().max(1)))?.clone();
        let to = dirs.get(self.rng.below(dirs.len()))?.join(self.fresh("snap"));
        sh(
            "btrfs",
            &["subvolume".as_ref(), "snapshot".as_ref(), self.abs(&from).as_os_str(), self.abs(&to).as_os_str()],
        );
        self.subvols.push(to.clone());
        Some(format!("btrfs subvolume snapshot {} {}", from.display(), to.display()))
    }

    fn subvol_delete(&mut self) -> Option<String> {
        // One with no other subvolume inside (delete refuses those).
        let i = (0..self.subvols.len()).rev().find(|&i| {
            let p = &self.subvols[i];
            !self.subvols.iter().any(|q| q != p && q.starts_with(p))
        })?;
        let p = self.subvols.remove(i);
        if let Err(e) = try_sh("btrfs", &["subvolume".as_ref(), "delete".as_ref(), self.abs(&p).as_os_str()]) {
            panic!("{e}");
        }
        Some(format!("btrfs subvolume delete {}", p.display()))
    }

    fn abs(&self, rel: &Path) -> PathBuf {
        self.vol.join(rel)
    }

    /// A non-root directory and a directory outside its subtree (not its parent when `across`).
    fn mover_and_target(&mut self, dirs: &[PathBuf], across: bool) -> Option<(PathBuf, PathBuf)> {
        let movable = self.movable(dirs);
        for _ in 0..20 {
            let d = movable.get(self.rng.below(movable.len().max(1)))?;
            let targets: Vec<&PathBuf> =
                dirs.iter().filter(|p| !p.starts_with(d) && (!across || Some(p.as_path()) != d.parent())).collect();
            if let Some(p) = targets.get(self.rng.below(targets.len().max(1))) {
                return Some(((*d).clone(), (*p).clone()));
            }
        }
        None
    }

    fn mv_across(&mut self, dirs: &[PathBuf]) -> Option<String> {
        let (d, p) = self.mover_and_target(dirs, true)?;
        let to = p.join(self.fresh("mv"));
        rename(&self.abs(&d), &self.abs(&to))?;
        Some(format!("mv {} {}", d.display(), to.display()))
    }

    fn mv_within(&mut self, dirs: &[PathBuf]) -> Option<String> {
        let movable = self.movable(dirs);
        let d = (*movable.get(self.rng.below(movable.len().max(1)))?).clone();
        let to = d.parent().unwrap().join(self.fresh("mv"));
        rename(&self.abs(&d), &self.abs(&to))?;
        Some(format!("mv {} {}", d.display(), to.display()))
    }

    fn exchange(&mut self, dirs: &[PathBuf]) -> Option<String> {
        let movable = self.movable(dirs);
        for _ in 0..20 {
            let a = movable.get(self.rng.below(movable.len().max(1)))?;
            let b = movable.get(self.rng.below(movable.len()))?;
            if a.starts_with(b) || b.starts_with(a) {
                continue;
            }
            exchange(&self.abs(a), &self.abs(b))?;
            return Some(format!("renameat2({}, {}, RENAME_EXCHANGE)", a.display(), b.display()));
        }
        None
    }

    fn mkdir_mv(&mut self, dirs: &[PathBuf]) -> Option<String> {
        let (d, p) = self.mover_and_target(dirs, false)?;
        let new = p.join(self.fresh("new"));
        std::fs::create_dir(self.abs(&new)).unwrap();
        let to = new.join(d.file_name().unwrap());
        if rename(&self.abs(&d), &self.abs(&to)).is_none() {
            return Some(format!(
                "mkdir {} (mv {} {} failed: another filesystem)",
                new.display(),
                d.display(),
                to.display()
            ));
        }
        Some(format!("mkdir {}; mv {} {}", new.display(), d.display(), to.display()))
    }

    fn create(&mut self, dirs: &[PathBuf]) -> Option<String> {
        let p = dirs.get(self.rng.below(dirs.len()))?.join(self.fresh("c"));
        std::fs::write(self.abs(&p), b"new").unwrap();
        chmod(&self.abs(&p), 0o600);
        Some(format!("create {} (root:root 0600)", p.display()))
    }

    fn unlink(&mut self, files: &[PathBuf]) -> Option<String> {
        let f = files.get(self.rng.below(files.len().max(1)))?;
        std::fs::remove_file(self.abs(f)).unwrap();
        Some(format!("rm {}", f.display()))
    }

    fn hardlink_unlink(&mut self, dirs: &[PathBuf], files: &[PathBuf]) -> Option<String> {
        let f = files.get(self.rng.below(files.len().max(1)))?.clone();
        let to = dirs[self.rng.below(dirs.len())].join(self.fresh("ln"));
        cross_ok(std::fs::hard_link(self.abs(&f), self.abs(&to)))?;
        std::fs::remove_file(self.abs(&f)).unwrap();
        Some(format!("ln {} {}; rm {}", f.display(), to.display(), f.display()))
    }

    fn dir_to_symlink(&mut self, dirs: &[PathBuf]) -> Option<String> {
        let (d, p) = self.mover_and_target(dirs, false)?;
        let to = p.join(self.fresh("away"));
        rename(&self.abs(&d), &self.abs(&to))?;
        std::os::unix::fs::symlink(&self.outside, self.abs(&d)).unwrap();
        Some(format!("mv {} {}; ln -s OUTSIDE {}", d.display(), to.display(), d.display()))
    }
}

/// The state letter of process `pid` (`T` stopped), if it is there.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// The digest volprep records of the mount points below `vol` (as `/proc/self/mountinfo` lists
/// them now): 16 hex digits of the SHA-256 of the sorted relative paths, each followed by NUL.
fn mounts_digest(vol: &Path) -> String {
    use sha2::{Digest, Sha256};
    let root = std::fs::canonicalize(vol).unwrap();
    let root = root.as_os_str().as_bytes();
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut points: Vec<Vec<u8>> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_octal)
        .filter_map(|p| Some(p.strip_prefix(root)?.strip_prefix(b"/")?.to_vec()))
        .filter(|p| !p.is_empty())
        .collect();
    points.sort_unstable();
    points.dedup();
    let mut h = Sha256::new();
    for p in points {
        h.update(&p);
        h.update([0]);
    }
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// A mountinfo field with its `\NNN` octal escapes undone.
fn unescape_octal(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c))) {
            Some(d) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

/// How a run is interrupted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Interrupt {
    None,
    /// The binary's hook at that many entries: `kill`, `term` or `stop` (held while a mount
    /// changes, then continued).
    At(u64, &'static str),
    /// SIGTERM sent from outside after that many milliseconds (rounds with a `--max-ops`
    /// ceiling: the walk is then waiting in the gate).
    TermAfter(u64),
}

/// Runs a volprep pass to its end (at most two minutes) and says how it ended.
fn run_ending(mut cmd: Command) -> (End, String) {
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    let cmdline = format!("{cmd:?}");
    let child = KillOnDrop(cmd.spawn().expect("spawn volprep"));
    ending(wait_within(child, Duration::from_secs(120), &cmdline))
}

/// [`run_ending`] with a SIGTERM sent `ms` milliseconds after the start (if it still runs).
fn run_ending_term(mut cmd: Command, ms: u64) -> (End, String) {
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    let cmdline = format!("{cmd:?}");
    let mut child = KillOnDrop(cmd.spawn().expect("spawn volprep"));
    std::thread::sleep(Duration::from_millis(ms));
    if child.0.try_wait().unwrap().is_none() {
        // SAFETY: kill takes plain integers.
        unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    }
    ending(wait_within(child, Duration::from_secs(120), &cmdline))
}

/// How a finished pass ended, and its stderr.
fn ending(out: std::process::Output) -> (End, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let end = match (out.status.signal(), out.status.code()) {
        (Some(libc::SIGKILL), _) => End::Sigkill,
        (_, Some(143)) => End::Sigterm,
        (_, Some(0)) => End::Finished,
        (_, Some(c)) => End::Exit(c),
        (Some(s), _) => End::Exit(-s),
        _ => End::Exit(-1),
    };
    (end, stderr)
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
}

/// `Some` on success, `None` when the change would cross filesystems or move a mount point
/// (EXDEV, EBUSY: clone rounds); panics on any other error.
fn cross_ok(r: std::io::Result<()>) -> Option<()> {
    match r {
        Ok(()) => Some(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EXDEV | libc::EBUSY)) => None,
        Err(e) => panic!("{e}"),
    }
}

fn rename(a: &Path, b: &Path) -> Option<()> {
    cross_ok(std::fs::rename(a, b))
}

/// `renameat2(a, b, RENAME_EXCHANGE)`.
fn exchange(a: &Path, b: &Path) -> Option<()> {
    let (ca, cb) = (CString::new(a.as_os_str().as_bytes()).unwrap(), CString::new(b.as_os_str().as_bytes()).unwrap());
    // SAFETY: two NUL-terminated paths relative to the cwd.
    let rc =
        unsafe { libc::renameat2(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), libc::RENAME_EXCHANGE) };
    cross_ok(if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) })
}

/// The sentinel next to the volume: what symlinks inside point at, root-owned and
/// non-conforming, so any change to it shows.
fn make_outside(outside: &Path) {
    std::fs::create_dir_all(outside.join("d")).unwrap();
    std::fs::write(outside.join("canary"), b"x").unwrap();
    std::fs::write(outside.join("d/secret"), b"x").unwrap();
    chmod(&outside.join("canary"), 0o600);
    chmod(&outside.join("d/secret"), 0o4750);
    chmod(&outside.join("d"), 0o700);
}

/// Directories (the root as "") and regular files below `vol`, never through a symlink.
fn list_tree(vol: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut dirs, mut files) = (vec![PathBuf::new()], Vec::new());
    let mut i = 0;
    while i < dirs.len() {
        let rel = dirs[i].clone();
        let mut names: Vec<_> = std::fs::read_dir(vol.join(&rel)).unwrap().map(|e| e.unwrap()).collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                dirs.push(rel.join(e.file_name()));
            } else if ft.is_file() {
                files.push(rel.join(e.file_name()));
            }
        }
        i += 1;
    }
    (dirs, files)
}

/// Names of app-private paths and their signs (`apps::TABLE`), for directories and files.
const APP_DIR_NAMES: &[&str] = &[".ssh", "global", "private-keys-v1.d", "member", "wal", "snap"];
const APP_FILE_NAMES: &[&str] =
    &["PG_VERSION", ".erlang.cookie", "pubring.kbx", "server.key", ".pgpass", "id_rsa", "authorized_keys"];

/// Whether `path` may be an app path's by its name: a name of the table, or a file in `.ssh/`.
fn at_app_name(path: &[u8]) -> bool {
    let mut parts = path.rsplit(|&c| c == b'/');
    let name = parts.next().unwrap_or_default();
    let parent = parts.next().unwrap_or_default();
    APP_FILE_NAMES.iter().chain(APP_DIR_NAMES).any(|n| n.as_bytes() == name) || parent == b".ssh"
}

/// An entry's name: `eN`, or now and then (1 in 6) a name of an app path of the table, unless
/// `parent` has it already; whoever the entry's owner (the app, or another uid planting it).
fn entry_name(
    rng: &mut Rng,
    i: usize,
    names: &[&str],
    taken: &mut std::collections::HashSet<Vec<u8>>,
    parent: &[u8],
) -> Vec<u8> {
    let join = |name: &[u8]| if parent.is_empty() { name.to_vec() } else { [parent, b"/", name].concat() };
    if rng.below(6) == 0 {
        let path = join(names[rng.below(names.len())].as_bytes());
        if taken.insert(path.clone()) {
            return path;
        }
    }
    join(format!("e{i}").as_bytes())
}

/// A random tree of 30–400 entries: directories up to 5 deep, files, setgid directories,
/// setuid/setgid files, hardlinks, symlinks to the sentinel outside, dangling and relative;
/// some named as app paths (`.ssh`, `PG_VERSION`, `.erlang.cookie` ...), of the app's uid
/// (1000) or another's, hard links among them.
fn random_tree(rng: &mut Rng, outside: &Path) -> Tree {
    const OWNERS: &[(u32, u32)] = &[(0, 0), (1000, 1000), (1000, 2000), (0, 2000), (65534, 0)];
    const DIR_MODES: &[u32] = &[0o755, 0o700, 0o2775, 0o2770, 0o750, 0o1777];
    const FILE_MODES: &[u32] = &[0o644, 0o600, 0o664, 0o4755, 0o2755, 0o640, 0o660];
    let mut t = Tree::new();
    let (ru, rg) = OWNERS[rng.below(OWNERS.len())];
    t.root(ru, rg, [0o755, 0o2775, 0o700][rng.below(3)]);
    let n = 30 + rng.below(370);
    let mut dirs: Vec<Vec<u8>> = vec![Vec::new()];
    let mut files: Vec<Vec<u8>> = Vec::new();
    let outside = outside.as_os_str().as_bytes();
    let mut taken = std::collections::HashSet::new();
    // App names draw from a stream of their own: the trees' shapes are those of the seed before.
    let mut names_rng = rng.fork(0x6170_702d_7361_6665);
    for i in 0..n {
        let parent = dirs[rng.below(dirs.len())].clone();
        let (uid, gid) = OWNERS[rng.below(OWNERS.len())];
        let roll = rng.below(100);
        let names = if roll < 25 { APP_DIR_NAMES } else { APP_FILE_NAMES };
        let path = entry_name(&mut names_rng, i, names, &mut taken, &parent);
        let depth = path.iter().filter(|&&c| c == b'/').count();
        match roll {
            0..=24 if depth < 5 => {
                t.dir(&path, uid, gid, DIR_MODES[rng.below(DIR_MODES.len())]);
                dirs.push(path);
            }
            25..=31 => {
                let target: Vec<u8> = match rng.below(3) {
                    0 => outside.to_vec(),
                    1 => [outside, b"/canary"].concat(),
                    _ => b"../../outside/d".to_vec(),
                };
                t.symlink(&path, target, uid, gid);
            }
            32..=37 if !files.is_empty() => {
                let to = files[rng.below(files.len())].clone();
                t.hardlink(&path, to);
            }
            _ => {
                t.file(&path, uid, gid, FILE_MODES[rng.below(FILE_MODES.len())]);
                files.push(path);
            }
        }
    }
    t
}

/// The tree, one entry a line (for a failure message; at most 60 lines).
fn describe_tree(t: &Tree) -> String {
    let mut out: Vec<String> = t
        .entries
        .iter()
        .take(60)
        .map(|e| format!("  {} {:?} {}:{} {:04o}", snap::show(&e.path), kind_of(e), e.uid, e.gid, e.mode))
        .collect();
    if t.entries.len() > 60 {
        out.push(format!("  ... {} entries in all", t.entries.len()));
    }
    out.join("\n")
}

fn kind_of(e: &tree::Entry) -> &'static str {
    match e.node {
        tree::Node::Dir => "dir",
        tree::Node::File(_) => "file",
        tree::Node::Symlink(_) => "symlink",
        tree::Node::Hardlink(_) => "hardlink",
        _ => "other",
    }
}
