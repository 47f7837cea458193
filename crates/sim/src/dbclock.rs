//! SQLite's clock on the run's virtual time.
//!
//! The SQLite store stamps an inbox row with the database's own clock
//! (`processed_at DEFAULT strftime(…, 'now')`) and retention measures a row's age there
//! (`DELETE … WHERE processed_at < 'now' − retention`), as a database server does. SQLite reads
//! 'now' from its VFS (`xCurrentTimeInt64`); on the real clock a run of minutes of virtual time
//! lasts a second, so no row would ever age and retention's inbox deletes could not be
//! simulated (nor replayed). [`install`] registers, as the default VFS, a copy of the default
//! one whose clock reads the run's virtual time on a thread that [`anchor`] has set (every
//! run's thread), and the real time elsewhere.

use std::cell::Cell;
use std::os::raw::c_int;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::ffi;
use tokio::time::Instant;

/// Milliseconds from the Julian day epoch to the Unix epoch (SQLite's `xCurrentTimeInt64` unit).
const UNIX_EPOCH_JULIAN_MS: i64 = 210_866_760_000_000;

thread_local! {
    /// The run on this thread: its virtual start and the wall-clock time at it.
    static RUN: Cell<Option<(Instant, SystemTime)>> = const { Cell::new(None) };
}

/// The VFS copied, whose clock is asked when no run is anchored on the thread. Kept as an
/// address: SQLite's VFS objects are registered for the process's life.
static ORIGINAL: OnceLock<usize> = OnceLock::new();

/// Registers the virtual clock's VFS as SQLite's default, once per process; connections opened
/// afterwards read it. Without a default VFS (not expected) nothing changes.
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `sqlite3_vfs_find(NULL)` returns the default VFS, registered for the
        // process's life (or null). The copy is leaked, so it outlives every connection, as
        // `sqlite3_vfs_register` requires; every field but the name, the list link and the
        // clock is the original's, so files opened through it are the original's (its
        // `pAppData` included).
        unsafe {
            let default = ffi::sqlite3_vfs_find(std::ptr::null());
            if default.is_null() {
                return;
            }
            let _ = ORIGINAL.set(default as usize);
            let mut copy: ffi::sqlite3_vfs = std::ptr::read(default);
            copy.zName = c"sim-virtual-clock".as_ptr();
            copy.pNext = std::ptr::null_mut();
            copy.xCurrentTimeInt64 = Some(current_time);
            copy.iVersion = copy.iVersion.max(2);
            ffi::sqlite3_vfs_register(Box::into_raw(Box::new(copy)), 1);
        }
    });
}

/// Makes SQLite's 'now' on this thread read `anchor` plus the virtual time since `start`.
pub fn anchor(start: Instant, anchor: SystemTime) {
    RUN.with(|run| run.set(Some((start, anchor))));
}

/// `xCurrentTimeInt64`: the run's virtual time on an anchored thread, else the original's.
unsafe extern "C" fn current_time(vfs: *mut ffi::sqlite3_vfs, out: *mut i64) -> c_int {
    if let Some((start, anchor)) = RUN.with(Cell::get) {
        let now = anchor + start.elapsed();
        let unix_ms = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        // SAFETY: SQLite passes a valid pointer to write the time to.
        unsafe { *out = unix_ms + UNIX_EPOCH_JULIAN_MS };
        return ffi::SQLITE_OK;
    }
    let Some(original) = ORIGINAL.get().map(|&a| a as *mut ffi::sqlite3_vfs) else {
        return ffi::SQLITE_ERROR;
    };
    // SAFETY: the original VFS lives for the process's life; its clock takes its own pointer
    // (not `vfs`, our copy) as every VFS method does.
    let _ = vfs;
    unsafe {
        match (*original).xCurrentTimeInt64 {
            Some(clock) => clock(original, out),
            None => ffi::SQLITE_ERROR,
        }
    }
}
