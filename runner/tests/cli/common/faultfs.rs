//! A FUSE file system serving one model file, mounted by the test process itself (`fuser`, pure
//! Rust: as root it calls mount(2) on /dev/fuse, no libfuse), that fails chosen byte ranges the
//! way failing storage does: EIO, an early end of file, a short read, or a read that never
//! returns. The kernel then hands bmoe a real error through the ordinary read path.
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, LockOwner,
    MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, Request,
};

/// What a read that touches a faulted range gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// EIO, as a failing flash block or network share gives.
    Eio,
    /// Half the bytes asked for (at least one). To the FUSE protocol a short answer is the end
    /// of the file, and the kernel takes it so.
    Short,
    /// No answer until the rule is disarmed: a hung device.
    Block,
}

/// A fault on byte ranges: the first `skip` reads touching them pass, the next `times` fail,
/// then they pass again (the storage recovered).
#[derive(Debug, Clone)]
pub struct Rule {
    pub ranges: Vec<(u64, u64)>,
    pub fault: Fault,
    pub skip: u64,
    pub times: u64,
}

impl Rule {
    fn touches(&self, off: u64, len: u64) -> bool {
        self.ranges.iter().any(|&(a, b)| off < b && a < off + len)
    }
}

/// One read the file system answered: offset, length asked, whether it was faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    pub offset: u64,
    pub len: u64,
    pub faulted: bool,
}

#[derive(Default)]
struct State {
    rule: Option<(Rule, u64)>,
    log: Vec<Read>,
}

struct Shared(Mutex<State>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

const ROOT: INodeNo = INodeNo::ROOT;
const FILE: INodeNo = INodeNo(2);
const TTL: Duration = Duration::from_secs(1);

struct FaultFs {
    backing: File,
    size: u64,
    name: String,
    direct_io: bool,
    shared: Arc<Shared>,
}

fn attr(ino: INodeNo, size: u64, kind: FileType) -> FileAttr {
    FileAttr {
        ino,
        size,
        blocks: size.div_ceil(512),
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm: if kind == FileType::Directory {
            0o755
        } else {
            0o644
        },
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: 4096,
    }
}

impl FaultFs {
    /// The fault this read meets, if any (counting it against the rule).
    fn fault_for(&self, off: u64, len: u64) -> Option<Fault> {
        let mut st = self.shared.lock();
        let fault = match st.rule.as_mut() {
            Some((rule, seen)) if rule.touches(off, len) => {
                *seen += 1;
                (*seen > rule.skip && *seen <= rule.skip + rule.times).then_some(rule.fault)
            }
            _ => None,
        };
        st.log.push(Read {
            offset: off,
            len,
            faulted: fault.is_some(),
        });
        fault
    }

    /// Waits while a blocking rule is armed (other requests are served by the other threads).
    fn block(&self) {
        while self
            .shared
            .lock()
            .rule
            .as_ref()
            .is_some_and(|(r, _)| r.fault == Fault::Block)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Filesystem for FaultFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        // Without it the kernel refuses to map a direct_io file shared (ENODEV), and bmoe's
        // loads map the model.
        if self.direct_io {
            let _ = config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name.to_str() == Some(self.name.as_str()) {
            reply.entry(
                &TTL,
                &attr(FILE, self.size, FileType::RegularFile),
                fuser::Generation(0),
            );
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino {
            ROOT => reply.attr(&TTL, &attr(ROOT, 0, FileType::Directory)),
            FILE => reply.attr(&TTL, &attr(FILE, self.size, FileType::RegularFile)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let flags = if self.direct_io {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        };
        reply.opened(FileHandle(0), flags);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != FILE {
            return reply.error(Errno::ENOENT);
        }
        let len = u64::from(size).min(self.size.saturating_sub(offset));
        let len = match self.fault_for(offset, len) {
            Some(Fault::Eio) => return reply.error(Errno::EIO),
            Some(Fault::Short) => (len / 2).max(1),
            Some(Fault::Block) => {
                self.block();
                len
            }
            None => len,
        };
        let mut buf = vec![0u8; len as usize];
        match self.backing.read_exact_at(&mut buf, offset) {
            Ok(()) => reply.data(&buf),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT {
            return reply.error(Errno::ENOENT);
        }
        let entries = [
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
            (FILE, FileType::RegularFile, self.name.as_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

/// The mounted file system; unmounted (after releasing any blocked read) when dropped.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    notifier: fuser::Notifier,
    dir: tempfile::TempDir,
    name: String,
    shared: Arc<Shared>,
}

impl Mounted {
    /// Serves `backing` as `<mount>/<file name>`; `direct_io` makes the kernel send every read
    /// here (no page cache), as FUSE's `direct_io` open flag does (with mapping allowed).
    pub fn serve(backing: &Path, direct_io: bool) -> Mounted {
        let file = File::open(backing).expect("open the backing model");
        let size = file.metadata().unwrap().len();
        let name = backing.file_name().unwrap().to_string_lossy().into_owned();
        let shared = Arc::new(Shared(Mutex::new(State::default())));
        let fs = FaultFs {
            backing: file,
            size,
            name: name.clone(),
            direct_io,
            shared: shared.clone(),
        };
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::default();
        cfg.mount_options = vec![MountOption::RO, MountOption::FSName("bmoe-faultfs".into())];
        // A blocked read holds one thread; the others keep answering.
        cfg.n_threads = Some(4);
        let session = fuser::spawn_mount(fs, dir.path(), &cfg).unwrap_or_else(|e| {
            panic!("mounting the fault-injecting FUSE file system (needs root and /dev/fuse): {e}")
        });
        Mounted {
            notifier: session.notifier(),
            session: Some(session),
            dir,
            name,
            shared,
        }
    }

    /// The served model's path.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join(&self.name)
    }

    /// Arms `rule` (replacing any other).
    pub fn arm(&self, rule: Rule) {
        self.shared.lock().rule = Some((rule, 0));
    }

    /// Disarms the rule; blocked reads return.
    pub fn disarm(&self) {
        self.shared.lock().rule = None;
    }

    /// Drops the kernel's cached pages of `len` bytes at `offset` (FUSE's inval_inode
    /// notification), unmapping them from every process that maps them: their next touch reads
    /// from here again.
    pub fn invalidate(&self, offset: u64, len: u64) {
        self.notifier
            .inval_inode(FILE, offset as i64, len as i64)
            .expect("the kernel takes the invalidation");
    }

    /// The reads answered so far.
    pub fn reads(&self) -> Vec<Read> {
        self.shared.lock().log.clone()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.disarm();
        // A process killed inside a read of this file (a probe's child) holds the file open
        // until its read is answered and it dies; until then umount(2) is EBUSY, and fuser's
        // umount_and_join, given up on the unmount, would wait for a session that never ends.
        // So the unmount is retried until the file is free; fuser then finds it unmounted.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            let unmounted = std::process::Command::new("umount")
                .arg(self.dir.path())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if unmounted {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(s) = self.session.take() {
            let _ = s.umount_and_join();
        }
    }
}
