//! A failed read of a mapped model page becomes an error of the compute that touched it, not the
//! death of the process. Resident weights (llama.cpp's mapping) and the dense weights of streamed
//! loads (`file_map`) are mapped from the model file; when the storage fails a page's read, the
//! kernel sends SIGBUS (`BUS_ADRERR`) to whichever thread touched it, in the middle of a compute.
//!
//! The handler installed here looks the faulting address up in `/proc/self/maps` (open, read,
//! close: async-signal-safe, a stack buffer, no allocation, no lock) and, only when the mapping is
//! of a model file registered before its load and the code is `BUS_ADRERR`, maps an anonymous
//! zero page over the faulting page and records it: the instruction then reads zeros and the
//! compute finishes, with garbage. Anything else (another file, another cause) restores the
//! previous disposition and returns, so the fault repeats and the process dies as before.
//!
//! After every compute that can touch the weights (and after a load) the engine calls `take`: a
//! recorded fault maps the file back over the replaced pages (so the next touch reads from the
//! storage again) and becomes a typed error, and whatever the compute produced is thrown away.
use std::ffi::c_void;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock, PoisonError};

/// Model files a fault may be taken on (a split model counts each shard).
const MAX_FILES: usize = 64;
/// Pages one compute may lose before the handler gives up and lets the process die.
const MAX_PAGES: usize = 64;

/// A failed read of a mapped page of a model file, taken after the compute that met it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: reading the mapped page at offset {offset} failed (SIGBUS: the storage returned an I/O error){}", path.display(), more(*pages, *faults, restore))]
pub struct MappedReadFailed {
    /// The model file.
    pub path: PathBuf,
    /// The file offset of the first page that failed.
    pub offset: u64,
    /// Distinct pages replaced by zeros during the compute.
    pub pages: usize,
    /// SIGBUS signals taken (several threads can fault on one page).
    pub faults: u64,
    /// Why a page could not be mapped back from the file, if one could not.
    pub restore: Option<String>,
}

fn more(pages: usize, faults: u64, restore: &Option<String>) -> String {
    let mut s = String::new();
    if pages > 1 {
        s.push_str(&format!("; {pages} pages in all ({faults} faults)"));
    }
    if let Some(r) = restore {
        s.push_str(&format!("; mapping the file back failed: {r}"));
    }
    s
}

/// A registered model file: device (major, minor as /proc/self/maps prints them) and inode.
struct FileSlot {
    major: AtomicU64,
    minor: AtomicU64,
    ino: AtomicU64,
}

/// A page the handler replaced by zeros.
struct PageSlot {
    /// The page's address; 0 = free. Claimed by compare-exchange.
    addr: AtomicUsize,
    /// Set once the other fields are written.
    ready: AtomicBool,
    file: AtomicUsize,
    offset: AtomicU64,
    prot: AtomicI32,
    flags: AtomicI32,
}

static FILES: [FileSlot; MAX_FILES] = [const {
    FileSlot {
        major: AtomicU64::new(0),
        minor: AtomicU64::new(0),
        ino: AtomicU64::new(0),
    }
}; MAX_FILES];
/// Registered entries of `FILES` (published after the entry is written).
static N_FILES: AtomicUsize = AtomicUsize::new(0);
/// The registered files' paths, by index, for mapping pages back (never read by the handler).
static PATHS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

static PAGES: [PageSlot; MAX_PAGES] = [const {
    PageSlot {
        addr: AtomicUsize::new(0),
        ready: AtomicBool::new(false),
        file: AtomicUsize::new(0),
        offset: AtomicU64::new(0),
        prot: AtomicI32::new(0),
        flags: AtomicI32::new(0),
    }
}; MAX_PAGES];
/// SIGBUS signals taken on registered files since the last `take`.
static FAULTS: AtomicU64 = AtomicU64::new(0);
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);
/// The disposition before ours, restored for any fault that is not a model page's.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
static INSTALL: Once = Once::new();

/// Installs the SIGBUS handler, once per process.
pub fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sysconf is a plain query.
        let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if ps > 0 {
            PAGE_SIZE.store(ps as usize, Ordering::Relaxed);
        }
        // SAFETY: `old` is plain data the kernel fills; reading the current disposition changes
        // nothing.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
            return;
        }
        // Stored before ours goes in, so the handler always finds it.
        let _ = PREVIOUS.set(old);
        // SAFETY: `on_sigbus` has the SA_SIGINFO signature and only makes async-signal-safe
        // calls (see it); the mask is emptied before use.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
    });
}

/// Registers `path` (before it is mapped) as a model file whose failed page reads the handler
/// turns into errors. Idempotent; a full table leaves a file unregistered (its faults kill, as
/// before).
pub fn register(path: &Path) {
    let Ok(md) = std::fs::metadata(path) else {
        return;
    };
    install();
    let (major, minor) = (libc::major(md.dev()) as u64, libc::minor(md.dev()) as u64);
    let mut paths = PATHS.lock().unwrap_or_else(PoisonError::into_inner);
    let n = N_FILES.load(Ordering::Acquire);
    let known = (0..n).find(|&i| {
        let f = &FILES[i];
        f.major.load(Ordering::Relaxed) == major
            && f.minor.load(Ordering::Relaxed) == minor
            && f.ino.load(Ordering::Relaxed) == md.ino()
    });
    if let Some(i) = known {
        paths[i] = path.to_path_buf();
        return;
    }
    if n == MAX_FILES {
        return;
    }
    FILES[n].major.store(major, Ordering::Relaxed);
    FILES[n].minor.store(minor, Ordering::Relaxed);
    FILES[n].ino.store(md.ino(), Ordering::Relaxed);
    paths.push(path.to_path_buf());
    N_FILES.store(n + 1, Ordering::Release);
}

/// One line of /proc/self/maps, the fields the handler needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MapLine {
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// `rwxp` / `rwxs`.
    pub(crate) perms: [u8; 4],
    pub(crate) offset: u64,
    pub(crate) major: u64,
    pub(crate) minor: u64,
    pub(crate) ino: u64,
}

/// A byte-at-a-time parser of /proc/self/maps: no allocation, so the signal handler can feed it
/// from a stack buffer. Fields past the inode (the path) are skipped.
#[derive(Default)]
pub(crate) struct MapsParser {
    line: MapLine,
    /// 0 start, 1 end, 2 perms, 3 offset, 4 major, 5 minor, 6 inode, 7 the rest.
    field: u8,
    perm_i: usize,
    /// A field's digits have begun (spaces between fields are skipped).
    began: bool,
}

fn hex(b: u8) -> Option<u64> {
    match b {
        b'0'..=b'9' => Some(u64::from(b - b'0')),
        b'a'..=b'f' => Some(u64::from(b - b'a' + 10)),
        b'A'..=b'F' => Some(u64::from(b - b'A' + 10)),
        _ => None,
    }
}

impl MapsParser {
    /// Feeds one byte; a completed line is returned at its newline.
    pub(crate) fn feed(&mut self, b: u8) -> Option<MapLine> {
        if b == b'\n' {
            let done = (self.field >= 6).then_some(self.line);
            *self = MapsParser::default();
            return done;
        }
        let l = &mut self.line;
        match (self.field, b) {
            (7, _) => {}
            (0, b'-') => self.field = 1,
            (0, _) => {
                l.start = l
                    .start
                    .wrapping_mul(16)
                    .wrapping_add(hex(b).unwrap_or(0) as usize)
            }
            (1, b' ') => self.field = 2,
            (1, _) => {
                l.end = l
                    .end
                    .wrapping_mul(16)
                    .wrapping_add(hex(b).unwrap_or(0) as usize)
            }
            (2, b' ') => self.field = 3,
            (2, _) => {
                if let Some(p) = l.perms.get_mut(self.perm_i) {
                    *p = b;
                }
                self.perm_i += 1;
            }
            (3, b' ') => self.field = 4,
            (3, _) => l.offset = l.offset.wrapping_mul(16).wrapping_add(hex(b).unwrap_or(0)),
            (4, b':') => self.field = 5,
            (4, _) => l.major = l.major.wrapping_mul(16).wrapping_add(hex(b).unwrap_or(0)),
            (5, b' ') => self.field = 6,
            (5, _) => l.minor = l.minor.wrapping_mul(16).wrapping_add(hex(b).unwrap_or(0)),
            (6, b' ') if self.began => self.field = 7,
            (6, b' ') => {}
            (6, _) => {
                self.began = true;
                l.ino = l
                    .ino
                    .wrapping_mul(10)
                    .wrapping_add(u64::from(b.wrapping_sub(b'0')));
            }
            _ => {}
        }
        None
    }
}

/// The mapping of this process that contains `addr`, read from /proc/self/maps with open, read
/// and close only (async-signal-safe; a stack buffer).
fn mapping_of(addr: usize) -> Option<MapLine> {
    // SAFETY: a NUL-terminated literal path; the fd is closed below on every path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 512];
    let mut p = MapsParser::default();
    let mut found = None;
    'read: loop {
        // SAFETY: `buf` is valid for its length and owned by this frame.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast::<c_void>(), buf.len()) };
        if n <= 0 {
            break;
        }
        for &b in &buf[..n as usize] {
            if let Some(l) = p.feed(b) {
                if l.start <= addr && addr < l.end {
                    found = Some(l);
                    break 'read;
                }
            }
        }
    }
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    found
}

/// The registered file a mapping is of.
fn registered(l: &MapLine) -> Option<usize> {
    let n = N_FILES.load(Ordering::Acquire).min(MAX_FILES);
    (0..n).find(|&i| {
        let f = &FILES[i];
        l.ino != 0
            && f.ino.load(Ordering::Relaxed) == l.ino
            && f.major.load(Ordering::Relaxed) == l.major
            && f.minor.load(Ordering::Relaxed) == l.minor
    })
}

fn prot_of(perms: &[u8; 4]) -> i32 {
    let mut p = libc::PROT_NONE;
    if perms[0] == b'r' {
        p |= libc::PROT_READ;
    }
    if perms[1] == b'w' {
        p |= libc::PROT_WRITE;
    }
    if perms[2] == b'x' {
        p |= libc::PROT_EXEC;
    }
    p
}

/// Maps `len` bytes at `addr` with the raw system call (the libc wrapper is not on the list of
/// async-signal-safe functions). Returns whether the kernel placed the mapping there.
///
/// # Safety
/// `addr` must be page-aligned and the range must belong to a mapping the caller may replace.
unsafe fn mmap_fixed(addr: usize, len: usize, prot: i32, flags: i32, fd: i32, off: u64) -> bool {
    let r = libc::syscall(
        libc::SYS_mmap,
        addr,
        len,
        prot,
        flags | libc::MAP_FIXED,
        fd,
        off,
    );
    r as usize == addr
}

/// The handler's decision for one fault at `addr`: true when it was a registered model file's
/// page and a zero page now stands in for it.
fn replace_page(addr: usize) -> bool {
    let ps = PAGE_SIZE.load(Ordering::Relaxed);
    let page = addr & !(ps - 1);
    if PAGES.iter().any(|s| s.addr.load(Ordering::Acquire) == page) {
        // Another thread replaced it (or is replacing it): the retried access finds zeros.
        FAULTS.fetch_add(1, Ordering::Relaxed);
        return true;
    }
    let Some(l) = mapping_of(addr) else {
        return false;
    };
    let Some(file) = registered(&l) else {
        return false;
    };
    let Some(slot) = PAGES.iter().find(|s| {
        s.addr
            .compare_exchange(0, page, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) else {
        return false;
    };
    let prot = prot_of(&l.perms);
    let flags = if l.perms[3] == b's' {
        libc::MAP_SHARED
    } else {
        libc::MAP_PRIVATE
    };
    // SAFETY: `page` lies inside a mapping of a registered model file (read-only weights the
    // engine never writes); the anonymous page replaces exactly that page, and `take` maps the
    // file back over it after the compute.
    if !unsafe {
        mmap_fixed(
            page,
            ps,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } {
        slot.addr.store(0, Ordering::Release);
        return false;
    }
    slot.file.store(file, Ordering::Relaxed);
    slot.offset
        .store(l.offset + (page - l.start) as u64, Ordering::Relaxed);
    slot.prot.store(prot, Ordering::Relaxed);
    slot.flags.store(flags, Ordering::Relaxed);
    slot.ready.store(true, Ordering::Release);
    FAULTS.fetch_add(1, Ordering::Relaxed);
    true
}

extern "C" fn on_sigbus(_sig: i32, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; si_addr is the
    // faulting address for SIGBUS.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == libc::BUS_ADRERR && replace_page(addr) {
        return;
    }
    // Not a model page: the previous disposition goes back and the access, retried, faults again
    // under it (the default kills the process, as it did before this handler).
    if let Some(old) = PREVIOUS.get() {
        // SAFETY: sigaction is async-signal-safe; `old` is what the kernel gave at install.
        unsafe { libc::sigaction(libc::SIGBUS, old, std::ptr::null_mut()) };
    }
}

/// What `take` does with the replaced pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFault {
    /// Map the file back over them (their mapping lives on: a compute's weights).
    Restore,
    /// Leave them (their mapping is about to go: a load that failed).
    Discard,
}

/// The fault recorded since the last call, if any; the replaced pages are mapped back from the
/// file (`Restore`) or left to the unmapping that follows (`Discard`). A page that cannot be
/// mapped back stays recorded, so every later compute fails too rather than reading zeros.
pub fn take(after: AfterFault) -> Option<MappedReadFailed> {
    let faults = FAULTS.load(Ordering::Acquire);
    if faults == 0 {
        return None;
    }
    let paths = PATHS.lock().unwrap_or_else(PoisonError::into_inner);
    let (mut first, mut pages, mut restore) = (None, 0usize, None);
    for s in &PAGES {
        if !s.ready.load(Ordering::Acquire) {
            continue;
        }
        let file = s.file.load(Ordering::Relaxed);
        let offset = s.offset.load(Ordering::Relaxed);
        pages += 1;
        first.get_or_insert((file, offset));
        let res = match after {
            AfterFault::Restore => map_back(s, paths.get(file).map(PathBuf::as_path)),
            AfterFault::Discard => Ok(()),
        };
        match res {
            Ok(()) => {
                s.ready.store(false, Ordering::Relaxed);
                s.addr.store(0, Ordering::Release);
            }
            Err(e) => restore = Some(e),
        }
    }
    if restore.is_none() {
        FAULTS.fetch_sub(faults, Ordering::AcqRel);
    }
    let (file, offset) = first?;
    Some(MappedReadFailed {
        path: paths.get(file).cloned().unwrap_or_default(),
        offset,
        pages,
        faults,
        restore,
    })
}

/// Maps the file back over one replaced page, from its recorded offset, with the original
/// mapping's protection and sharing, through a descriptor of the engine's own.
fn map_back(s: &PageSlot, path: Option<&Path>) -> Result<(), String> {
    let path = path.ok_or("the file is not registered")?;
    let addr = s.addr.load(Ordering::Acquire);
    // Only over the zero page the handler put there: if the mapping went meanwhile (its model
    // was freed), nothing is mapped.
    match mapping_of(addr) {
        Some(l) if l.ino == 0 => {}
        _ => return Ok(()),
    }
    let f = std::fs::File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    let ps = PAGE_SIZE.load(Ordering::Relaxed);
    let (prot, flags) = (
        s.prot.load(Ordering::Relaxed),
        s.flags.load(Ordering::Relaxed),
    );
    // SAFETY: `addr` is the page the handler replaced with an anonymous page inside a live model
    // mapping (checked just above); the file mapped back over it is the one it came from, at the
    // same offset, with the same protection and sharing. The mapping keeps the file open.
    if unsafe { mmap_fixed(addr, ps, prot, flags, fd, s.offset.load(Ordering::Relaxed)) } {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_maps_line_is_parsed() {
        let text = b"7f12a000-7f12c000 r--s 0001f000 00:35 1234567   /tmp/x y.gguf\n\
                     7ffd1000-7ffd2000 rw-p 00000000 00:00 0 \n";
        let mut p = MapsParser::default();
        let lines: Vec<MapLine> = text.iter().filter_map(|&b| p.feed(b)).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0],
            MapLine {
                start: 0x7f12a000,
                end: 0x7f12c000,
                perms: *b"r--s",
                offset: 0x1f000,
                major: 0,
                minor: 0x35,
                ino: 1234567,
            }
        );
        assert_eq!(lines[1].ino, 0);
        assert_eq!(prot_of(&lines[1].perms), libc::PROT_READ | libc::PROT_WRITE);
    }

    /// A page past the end of a truncated file faults as a failed read does (SIGBUS,
    /// BUS_ADRERR): it reads as zeros, the fault is taken with the page's file offset, and the
    /// file is mapped back (its bytes read again once the file holds them again).
    #[test]
    fn a_failed_page_read_reads_zeros_and_the_file_is_mapped_back() {
        use std::io::Write;
        install();
        let ps = PAGE_SIZE.load(Ordering::Relaxed);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![0xab; 2 * ps]).unwrap();
        register(&path);
        let map = crate::ffi::file_map::FileMap::map(&std::fs::File::open(&path).unwrap()).unwrap();
        f.set_len(ps as u64).unwrap();
        let at = |i: usize| {
            // SAFETY: inside the mapping; volatile so the read is made where it is written.
            unsafe { std::ptr::read_volatile(map.bytes().as_ptr().add(i)) }
        };
        assert_eq!(at(0), 0xab);
        assert_eq!(at(ps + 7), 0, "the failed page reads as zeros");
        let e = take(AfterFault::Restore).expect("the fault was recorded");
        assert_eq!(
            (e.path.as_path(), e.offset, e.pages),
            (path.as_path(), ps as u64, 1)
        );
        assert_eq!(
            e.to_string(),
            format!(
                "{}: reading the mapped page at offset {ps} failed (SIGBUS: the storage returned an I/O error)",
                path.display()
            )
        );
        assert!(take(AfterFault::Restore).is_none(), "taken once");
        f.set_len(2 * ps as u64).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[0xcd; 8], ps as u64).unwrap();
        assert_eq!(
            at(ps + 7),
            0xcd,
            "the file is mapped back over the zero page"
        );
    }

    #[test]
    fn this_process_finds_its_own_stack() {
        let x = 5u8;
        let l = mapping_of(&x as *const u8 as usize).expect("the stack is mapped");
        assert!(l.start <= &x as *const u8 as usize);
        assert_eq!(l.perms[0], b'r');
    }
}
