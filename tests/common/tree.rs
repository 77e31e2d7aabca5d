//! A declarative tree builder: list entries (path, kind, owner, mode), then `build(root)`.
//! Paths are bytes (non-UTF-8 names welcome) relative to the root, `/`-separated, and may be far
//! longer than PATH_MAX: every entry is made relative to its parent's dirfd.

use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::fd;

/// What an entry is.
#[derive(Clone, Debug)]
pub enum Node {
    Dir,
    File(Vec<u8>),
    /// Symlink with this target (need not exist).
    Symlink(Vec<u8>),
    /// Another name for the entry at this root-relative path (declared earlier, short path).
    Hardlink(Vec<u8>),
    Fifo,
    /// A unix socket: bound with a real `UnixListener` when its absolute path fits in
    /// `sun_path`, otherwise made with `mknodat(S_IFSOCK)`.
    Socket,
    /// A character device (major, minor).
    CharDev(u32, u32),
    /// A block device (major, minor).
    BlockDev(u32, u32),
}

#[derive(Clone, Debug)]
pub struct Entry {
    pub path: Vec<u8>,
    pub node: Node,
    pub uid: u32,
    pub gid: u32,
    /// Permission and special bits (07777). Ignored for symlinks and hardlinks.
    pub mode: u32,
}

/// A list of entries to create, in order (parents first; missing parents are made 0755
/// root:root). The root's own owner and mode are set last.
#[derive(Clone, Debug, Default)]
pub struct Tree {
    pub entries: Vec<Entry>,
    pub root: Option<(u32, u32, u32)>,
}

impl Tree {
    pub fn new() -> Tree {
        Tree::default()
    }

    fn push(&mut self, path: &[u8], node: Node, uid: u32, gid: u32, mode: u32) -> &mut Tree {
        assert!(!path.is_empty() && !path.starts_with(b"/"), "relative path expected");
        self.entries.push(Entry { path: path.to_vec(), node, uid, gid, mode });
        self
    }

    /// Owner and mode of the root directory itself.
    pub fn root(&mut self, uid: u32, gid: u32, mode: u32) -> &mut Tree {
        self.root = Some((uid, gid, mode));
        self
    }

    pub fn dir(&mut self, path: impl AsRef<[u8]>, uid: u32, gid: u32, mode: u32) -> &mut Tree {
        self.push(path.as_ref(), Node::Dir, uid, gid, mode)
    }

    pub fn file(&mut self, path: impl AsRef<[u8]>, uid: u32, gid: u32, mode: u32) -> &mut Tree {
        let content = path.as_ref().to_vec();
        self.push(path.as_ref(), Node::File(content), uid, gid, mode)
    }

    pub fn symlink(&mut self, path: impl AsRef<[u8]>, target: impl AsRef<[u8]>, uid: u32, gid: u32) -> &mut Tree {
        self.push(path.as_ref(), Node::Symlink(target.as_ref().to_vec()), uid, gid, 0o777)
    }

    pub fn hardlink(&mut self, path: impl AsRef<[u8]>, to: impl AsRef<[u8]>) -> &mut Tree {
        self.push(path.as_ref(), Node::Hardlink(to.as_ref().to_vec()), 0, 0, 0)
    }

    pub fn fifo(&mut self, path: impl AsRef<[u8]>, uid: u32, gid: u32, mode: u32) -> &mut Tree {
        self.push(path.as_ref(), Node::Fifo, uid, gid, mode)
    }

    pub fn socket(&mut self, path: impl AsRef<[u8]>, uid: u32, gid: u32, mode: u32) -> &mut Tree {
        self.push(path.as_ref(), Node::Socket, uid, gid, mode)
    }

    pub fn chardev(&mut self, path: impl AsRef<[u8]>, dev: (u32, u32), uid: u32, gid: u32, mode: u32) -> &mut Tree {
        self.push(path.as_ref(), Node::CharDev(dev.0, dev.1), uid, gid, mode)
    }

    pub fn blockdev(&mut self, path: impl AsRef<[u8]>, dev: (u32, u32), uid: u32, gid: u32, mode: u32) -> &mut Tree {
        self.push(path.as_ref(), Node::BlockDev(dev.0, dev.1), uid, gid, mode)
    }

    /// Adds `other` below the new directory `prefix` (which gets `other`'s root owner and mode,
    /// or 0755 root:root); hardlink targets are re-rooted too.
    pub fn nest(&mut self, prefix: &str, other: &Tree) -> &mut Tree {
        let (uid, gid, mode) = other.root.unwrap_or((0, 0, 0o755));
        self.dir(prefix, uid, gid, mode);
        let pre = |p: &[u8]| [prefix.as_bytes(), b"/", p].concat();
        for e in &other.entries {
            let node = match &e.node {
                Node::Hardlink(to) => Node::Hardlink(pre(to)),
                n => n.clone(),
            };
            self.entries.push(Entry { path: pre(&e.path), node, ..e.clone() });
        }
        self
    }

    /// Entries a snapshot of the built tree holds: the declared ones plus the root (parents
    /// made implicitly are not counted).
    pub fn len(&self) -> usize {
        self.entries.len() + 1
    }

    /// Creates the entries below `root` (created if missing; it should be empty).
    pub fn build(&self, root: &Path) {
        std::fs::create_dir_all(root).unwrap_or_else(|e| panic!("mkdir {}: {e}", root.display()));
        let rootfd = fd::open_dir(root).expect("open tree root");
        // Entries are made in their parent's fd, reached from the previous entry's: siblings
        // and children cost one open, however deep (a 3,000-level chain builds in linear time).
        let mut dirs = fd::DirStack::open(root).expect("open tree root");
        for e in &self.entries {
            let (parent, _) = fd::split_parent(&e.path);
            let pfd = dirs
                .cd(parent, fd::Missing::Create)
                .unwrap_or_else(|err| panic!("open parent of {}: {err}", super::snap::show(&e.path)));
            make(root, rootfd.as_raw_fd(), pfd, e)
                .unwrap_or_else(|err| panic!("create {}: {err}", super::snap::show(&e.path)));
        }
        if let Some((uid, gid, mode)) = self.root {
            fd::fchown(rootfd.as_raw_fd(), uid, gid).expect("chown root");
            fd::fchmod(rootfd.as_raw_fd(), mode).expect("chmod root");
        }
    }
}

fn make(root: &Path, rootfd: i32, pfd: i32, e: &Entry) -> std::io::Result<()> {
    let (_, name) = fd::split_parent(&e.path);
    match &e.node {
        Node::Dir => fd::mkdir_at(pfd, name, 0o700)?,
        Node::File(content) => fd::create_file_at(pfd, name, content)?,
        Node::Symlink(target) => fd::symlink_at(target, pfd, name)?,
        Node::Hardlink(to) => return fd::link_at(rootfd, to, pfd, name),
        Node::Fifo => fd::mkfifo_at(pfd, name, 0o600)?,
        Node::Socket => {
            let abs = root.join(std::ffi::OsStr::from_bytes(&e.path));
            if abs.as_os_str().len() < 100 {
                drop(std::os::unix::net::UnixListener::bind(&abs)?);
            } else {
                fd::mknod_at(pfd, name, libc::S_IFSOCK | 0o600, 0)?;
            }
        }
        Node::CharDev(major, minor) => fd::mknod_at(pfd, name, libc::S_IFCHR | 0o600, libc::makedev(*major, *minor))?,
        Node::BlockDev(major, minor) => fd::mknod_at(pfd, name, libc::S_IFBLK | 0o600, libc::makedev(*major, *minor))?,
    }
    // Owner first: chown clears setuid/setgid of non-directories, the chmod then sets them.
    fd::lchown_at(pfd, name, e.uid, e.gid)?;
    if !matches!(e.node, Node::Symlink(_)) {
        fd::chmod_at(pfd, name, e.mode)?;
    }
    Ok(())
}

/// A small deterministic PRNG (splitmix64): the same seed gives the same tree.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Another stream, from this one's state and `salt`, without drawing from this one: what a
    /// new kind of draw uses so that the existing draws (and the cases they found) stay as they
    /// were.
    #[allow(dead_code)]
    pub fn fork(&self, salt: u64) -> Rng {
        Rng(self.0 ^ salt)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

pub const UIDS: &[u32] = &[0, 1000, 1001, 2000, 65534];
/// 2000 appears twice: the tests' target group, so many entries already conform.
pub const GIDS: &[u32] = &[0, 1000, 2000, 2000, 3000];
pub const FILE_MODES: &[u32] = &[
    0o644, 0o600, 0o660, 0o664, 0o666, 0o755, 0o775, 0o4755, 0o2755, 0o6755, 0o2644, 0o1644, 0o4770, 0o000, 0o440,
    0o777, 0o7777,
];
pub const DIR_MODES: &[u32] = &[0o755, 0o700, 0o2770, 0o2775, 0o1777, 0o3777, 0o555, 0o000, 0o2777, 0o711, 0o6775];

/// Options of a generated tree.
#[derive(Clone, Copy, Debug)]
pub struct GenOpts {
    /// Hardlinks (several names, one inode: counts per name and per inode differ).
    pub hardlinks: bool,
    /// Files with setuid/setgid(+group exec) bits: chown clears them, so an entry may need a
    /// chmod although its mode does not change.
    pub special_bits: bool,
}

impl Default for GenOpts {
    fn default() -> GenOpts {
        GenOpts { hardlinks: true, special_bits: true }
    }
}

/// `n` entries (plus the root) of mixed kinds, owners and modes, from `seed`: directories,
/// files, symlinks (dangling, relative, absolute to `outside` and into it), hardlinks, FIFOs,
/// sockets, names with non-UTF-8 bytes, backslashes, newlines and spaces.
pub fn generated(seed: u64, n: usize, outside: &Path, opts: GenOpts) -> Tree {
    let mut rng = Rng::new(seed);
    let mut t = Tree::new();
    let outside = outside.as_os_str().as_bytes();
    let mut dirs: Vec<Vec<u8>> = vec![Vec::new()];
    let mut files: Vec<Vec<u8>> = Vec::new();
    // Fill one directory with a batch of siblings at a time (like a real volume, and the
    // builder keeps the parent open).
    let mut i = 0;
    while i < n {
        let parent = dirs[rng.below(dirs.len())].clone();
        let batch = 1 + rng.below(40);
        for _ in 0..batch.min(n - i) {
            let stem = match rng.below(20) {
                0 => format!("caf\u{e9}-{i}").into_bytes(),
                1 => {
                    let mut v = b"n\xe9\xff-".to_vec();
                    v.extend_from_slice(i.to_string().as_bytes());
                    v
                }
                2 => format!("back\\slash {i}").into_bytes(),
                3 => format!("new\nline-{i}").into_bytes(),
                _ => format!("e{i}").into_bytes(),
            };
            let path = if parent.is_empty() { stem } else { [&parent[..], b"/", &stem[..]].concat() };
            let (uid, gid) = (rng.pick(UIDS), rng.pick(GIDS));
            let mut fmode = rng.pick(FILE_MODES);
            if !opts.special_bits {
                fmode &= 0o1777;
            }
            match rng.below(100) {
                0..=14 => {
                    let mut dmode = rng.pick(DIR_MODES);
                    if !opts.special_bits {
                        dmode &= 0o1777;
                    }
                    t.dir(&path, uid, gid, dmode);
                    dirs.push(path);
                }
                15..=74 => {
                    t.file(&path, uid, gid, fmode);
                    files.push(path);
                }
                75..=82 => {
                    let target: Vec<u8> = match rng.below(4) {
                        0 => b"does/not/exist".to_vec(),
                        1 => outside.to_vec(),
                        2 => [outside, b"/canary-file"].concat(),
                        _ => b"../e0".to_vec(),
                    };
                    t.symlink(&path, target, uid, gid);
                }
                83..=89 if opts.hardlinks && !files.is_empty() => {
                    let to = files[rng.below(files.len())].clone();
                    t.hardlink(&path, to);
                }
                83..=95 => {
                    t.fifo(&path, uid, gid, fmode & 0o777);
                }
                96 => {
                    t.socket(&path, uid, gid, fmode & 0o777);
                }
                _ => {
                    t.file(&path, uid, gid, fmode);
                    files.push(path);
                }
            }
            i += 1;
        }
    }
    t.root(1000, 1000, 0o755);
    t
}

/// A path component of 200 bytes, `tag` first.
pub fn long_name(tag: &str) -> String {
    format!("{tag}{}", "x".repeat(200 - tag.len()))
}

/// The path `long/<200 bytes>/<200 bytes>/...`, more than 4096 bytes long.
pub fn long_path() -> String {
    let mut p = String::from("long");
    for i in 0..22 {
        p.push('/');
        p.push_str(&long_name(&format!("L{i:02}")));
    }
    assert!(p.len() > 4096);
    p
}

/// Every special case once: setuid/setgid/sticky, conforming entries, dangling and outside
/// symlinks, hardlinks, a FIFO, a bound socket, a device, a > 4096-byte path, non-UTF-8 names.
/// `outside` is a directory outside the volume that symlinks point to (holding `canary-file`).
pub fn zoo(outside: &Path) -> Tree {
    let out = outside.as_os_str().as_bytes();
    let mut t = Tree::new();
    t.root(0, 0, 0o755)
        .dir("plain", 0, 0, 0o755)
        .file("plain/file", 1000, 1000, 0o644)
        .file("plain/private", 1000, 1000, 0o600)
        .file("plain/none", 0, 0, 0o000)
        .dir("special", 1000, 1000, 0o755)
        .file("special/setuid", 1000, 1000, 0o4755)
        .file("special/setgid", 1000, 1000, 0o2755)
        .file("special/setgid-noexec", 1000, 1000, 0o2644)
        .file("special/setuid-setgid", 0, 0, 0o6755)
        .file("special/sticky-file", 0, 0, 0o1644)
        .file("special/all-bits", 0, 0, 0o7777)
        .dir("special/sticky-dir", 0, 0, 0o1777)
        .dir("special/setgid-dir", 1000, 1000, 0o2755)
        .dir("special/setuid-dir", 1000, 1000, 0o4755)
        .dir("special/ro-dir", 0, 0, 0o555)
        .file("special/ro-dir/inside", 0, 0, 0o444)
        .dir("conform", 1000, 2000, 0o2770)
        .file("conform/file", 1000, 2000, 0o660)
        .file("conform/exec", 1000, 2000, 0o775)
        .file("conform/setuid", 1000, 2000, 0o4770)
        .symlink("conform/link", "file", 1000, 2000)
        .dir("links", 0, 0, 0o755)
        .symlink("links/dangling", "no/such/target", 1000, 1000)
        .symlink("links/outside-dir", out, 0, 0)
        .symlink("links/outside-file", [out, b"/canary-file"].concat(), 0, 0)
        .symlink("links/self-loop", "self-loop", 0, 0)
        .symlink("links/up", "../..", 0, 0)
        .symlink("links/to-setuid", "../special/setuid", 1000, 1000)
        .hardlink("links/hard-setuid", "special/setuid")
        .hardlink("links/hard-file", "plain/file")
        .dir("odd", 0, 0, 0o755)
        .fifo("odd/fifo", 0, 0, 0o600)
        .socket("odd/sock", 0, 0, 0o755)
        .chardev("odd/null", (1, 3), 0, 0, 0o600)
        // A block device nobody uses (loop major, a minor far past any attached device).
        .blockdev("odd/block", (7, 250), 0, 0, 0o640)
        .dir(b"caf\xe9", 1000, 1000, 0o750)
        .file(b"caf\xe9/\xff\xfe", 1000, 1000, 0o640)
        .file(b"caf\xe9/back\\slash", 1000, 1000, 0o640)
        .file("caf\u{e9}-utf8 name with spaces", 1000, 1000, 0o640)
        .file(b"new\nline", 0, 0, 0o600);
    let long = long_path();
    t.dir("long", 0, 0, 0o700);
    let mut p = String::from("long");
    for comp in long.split('/').skip(1) {
        p = format!("{p}/{comp}");
        t.dir(&p, 1000, 1000, 0o700);
    }
    t.file(format!("{long}/deep-file"), 1000, 1000, 0o4750)
        .symlink(format!("{long}/deep-link"), out, 1000, 1000)
        .fifo(format!("{long}/deep-fifo"), 0, 0, 0o600)
        .socket(format!("{long}/deep-sock"), 0, 0, 0o600)
        .dir(format!("{long}/deep-dir"), 0, 0, 0o2700);
    t
}
