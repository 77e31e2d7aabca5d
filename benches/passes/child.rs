//! Runs one method as a child process and measures it: wall time, and user/sys CPU and peak RSS
//! from `wait4`'s rusage (which also covers the grandchildren a shell waited for).

use std::io;
use std::process::Command;
use std::time::{Duration, Instant};

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl Exit {
    pub fn describe(self) -> String {
        match self {
            Exit::Code(c) => format!("exit {c}"),
            Exit::Signal(s) => format!("signal {s}"),
        }
    }
}

/// Figures of one child run.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub wall_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    pub maxrss_kib: u64,
    pub exit: Exit,
}

/// Spawns `cmd`; when it is still running after `kill_after`, SIGKILLs it. The kill only ever
/// targets our own unreaped child (checked with `WNOHANG` first), never a reused pid.
pub fn run_until(cmd: &mut Command, kill_after: Option<Duration>) -> io::Result<Measured> {
    let start = Instant::now();
    let child = cmd.spawn()?;
    let pid = child.id() as libc::pid_t;
    // `child` is not waited through std: wait4 below reaps it. Dropping a Child does not wait.
    drop(child);
    let mut status = 0;
    // SAFETY: rusage is plain old data; zeroed is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if let Some(after) = kill_after {
        let deadline = start + after;
        loop {
            // SAFETY: valid pointers to locals.
            let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
            if r == pid {
                return Ok(measured(start, status, &ru));
            }
            if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return Err(io::Error::last_os_error());
            }
            let now = Instant::now();
            if now >= deadline {
                // SAFETY: pid is our child and has not been reaped (wait4 returned 0).
                unsafe { libc::kill(pid, libc::SIGKILL) };
                break;
            }
            std::thread::sleep((deadline - now).min(Duration::from_micros(500)));
        }
    }
    loop {
        // SAFETY: valid pointers to locals.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            return Ok(measured(start, status, &ru));
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

fn measured(start: Instant, status: i32, ru: &libc::rusage) -> Measured {
    let wall_s = start.elapsed().as_secs_f64();
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let exit = if libc::WIFEXITED(status) {
        Exit::Code(libc::WEXITSTATUS(status))
    } else {
        Exit::Signal(libc::WTERMSIG(status))
    };
    Measured { wall_s, user_s: tv(ru.ru_utime), sys_s: tv(ru.ru_stime), maxrss_kib: ru.ru_maxrss as u64, exit }
}
