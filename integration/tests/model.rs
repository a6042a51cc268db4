//! Property test: random sequences of file-system operations against a plain in-memory model.
//! Every operation's outcome (success or error kind) and the final tree with every file's
//! bytes must match; the journal of the run must replay to the same dump.

use fs_core::{ErrorKind, FileKind, Fs, Ino, Owner, SetAttr, ROOT_INO};
use proptest::prelude::*;
use std::collections::BTreeMap;

const O: Owner = Owner { uid: 0, gid: 0 };
const NAMES: [&str; 3] = ["a", "b", "c"];

#[derive(Debug, Clone)]
enum Op {
    Create(usize, usize),
    Mkdir(usize, usize),
    Unlink(usize, usize),
    Rmdir(usize, usize),
    Rename(usize, usize, usize, usize),
    Link(usize, usize, usize, usize),
    Write(usize, usize, u32, u32, u8),
    Truncate(usize, usize, u32),
}

fn op() -> impl Strategy<Value = Op> {
    let p = 0..3usize;
    let n = 0..3usize;
    prop_oneof![
        3 => (p.clone(), n.clone()).prop_map(|(p, n)| Op::Create(p, n)),
        1 => (p.clone(), n.clone()).prop_map(|(p, n)| Op::Mkdir(p, n)),
        2 => (p.clone(), n.clone()).prop_map(|(p, n)| Op::Unlink(p, n)),
        1 => (p.clone(), n.clone()).prop_map(|(p, n)| Op::Rmdir(p, n)),
        2 => (p.clone(), n.clone(), p.clone(), n.clone()).prop_map(|(a, b, c, d)| Op::Rename(a, b, c, d)),
        1 => (p.clone(), n.clone(), p.clone(), n.clone()).prop_map(|(a, b, c, d)| Op::Link(a, b, c, d)),
        4 => (p.clone(), n.clone(), 0..300_000u32, 1..200_000u32, any::<u8>()).prop_map(|(p, n, o, l, s)| Op::Write(p, n, o, l, s)),
        2 => (p, n, 0..400_000u32).prop_map(|(p, n, l)| Op::Truncate(p, n, l)),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Obj {
    File(usize),
    Dir,
}

#[derive(Default)]
struct Model {
    entries: BTreeMap<(usize, usize), Obj>,
    files: Vec<(Vec<u8>, u32)>, // data, nlink
}

impl Model {
    fn drop_link(&mut self, o: Obj) {
        if let Obj::File(f) = o {
            self.files[f].1 -= 1;
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), ErrorKind> {
        use ErrorKind::*;
        match *op {
            Op::Create(p, n) | Op::Mkdir(p, n) => {
                if self.entries.contains_key(&(p, n)) {
                    return Err(AlreadyExists);
                }
                let o = if matches!(op, Op::Mkdir(..)) {
                    Obj::Dir
                } else {
                    self.files.push((Vec::new(), 1));
                    Obj::File(self.files.len() - 1)
                };
                self.entries.insert((p, n), o);
            }
            Op::Unlink(p, n) => match self.entries.get(&(p, n)).copied() {
                None => return Err(NotFound),
                Some(Obj::Dir) => return Err(IsDir),
                Some(o) => {
                    self.entries.remove(&(p, n));
                    self.drop_link(o);
                }
            },
            Op::Rmdir(p, n) => match self.entries.get(&(p, n)) {
                None => return Err(NotFound),
                Some(Obj::File(_)) => return Err(NotDir),
                Some(Obj::Dir) => {
                    self.entries.remove(&(p, n));
                }
            },
            Op::Rename(p1, n1, p2, n2) => {
                let src = *self.entries.get(&(p1, n1)).ok_or(NotFound)?;
                if (p1, n1) == (p2, n2) {
                    return Ok(());
                }
                if let Some(dst) = self.entries.get(&(p2, n2)).copied() {
                    match (src, dst) {
                        (Obj::File(a), Obj::File(b)) if a == b => return Ok(()),
                        (Obj::Dir, Obj::File(_)) => return Err(NotDir),
                        (Obj::File(_), Obj::Dir) => return Err(IsDir),
                        _ => self.drop_link(dst),
                    }
                }
                self.entries.remove(&(p1, n1));
                self.entries.insert((p2, n2), src);
            }
            Op::Link(p1, n1, p2, n2) => {
                let src = *self.entries.get(&(p1, n1)).ok_or(NotFound)?;
                let Obj::File(f) = src else {
                    return Err(PermissionDenied);
                };
                if self.entries.contains_key(&(p2, n2)) {
                    return Err(AlreadyExists);
                }
                self.files[f].1 += 1;
                self.entries.insert((p2, n2), src);
            }
            Op::Write(p, n, off, len, seed) => {
                let Obj::File(f) = *self.entries.get(&(p, n)).ok_or(NotFound)? else {
                    return Err(IsDir);
                };
                let d = &mut self.files[f].0;
                let end = (off + len) as usize;
                if d.len() < end {
                    d.resize(end, 0);
                }
                d[off as usize..end].copy_from_slice(&integration::data(seed as u64, len as usize));
            }
            Op::Truncate(p, n, len) => {
                let Obj::File(f) = *self.entries.get(&(p, n)).ok_or(NotFound)? else {
                    return Err(IsDir);
                };
                self.files[f].0.resize(len as usize, 0);
            }
        }
        Ok(())
    }
}

async fn run_on_fs(fs: &Fs, dirs: &[Ino; 3], op: &Op) -> Result<(), ErrorKind> {
    let name = |n: usize| NAMES[n].as_bytes();
    let r = match *op {
        Op::Create(p, n) => fs.create(dirs[p], name(n), 0o644, O).await.map(|_| ()),
        Op::Mkdir(p, n) => fs.mkdir(dirs[p], name(n), 0o755, O).await.map(|_| ()),
        Op::Unlink(p, n) => fs.unlink(dirs[p], name(n)).await,
        Op::Rmdir(p, n) => fs.rmdir(dirs[p], name(n)).await,
        Op::Rename(a, b, c, d) => fs.rename(dirs[a], name(b), dirs[c], name(d), false).await,
        Op::Link(a, b, c, d) => match fs.lookup(dirs[a], name(b)).await {
            Ok((ino, _)) => fs.link(ino, dirs[c], name(d)).await.map(|_| ()),
            Err(e) => Err(e),
        },
        Op::Write(p, n, off, len, seed) => match fs.lookup(dirs[p], name(n)).await {
            Ok((ino, _)) => {
                fs.write(
                    ino,
                    off as u64,
                    &integration::data(seed as u64, len as usize),
                )
                .await
            }
            Err(e) => Err(e),
        },
        Op::Truncate(p, n, len) => match fs.lookup(dirs[p], name(n)).await {
            Ok((ino, _)) => fs
                .setattr(
                    ino,
                    &SetAttr {
                        length: Some(len as u64),
                        ..Default::default()
                    },
                )
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        },
    };
    r.map_err(|e| e.kind())
}

async fn check(ops: Vec<Op>) {
    let mut v = integration::volume_with("rocksdb", "memory", |s| s.block_size = 64 << 10).await;
    v.fs.io_parallel = 4;
    let fs = &v.fs;
    let (x, _) = fs.mkdir(ROOT_INO, b"x", 0o755, O).await.unwrap();
    let (y, _) = fs.mkdir(ROOT_INO, b"y", 0o755, O).await.unwrap();
    let dirs = [ROOT_INO, x, y];
    let mut model = Model::default();
    for (i, op) in ops.iter().enumerate() {
        let want = model.apply(op);
        let got = run_on_fs(fs, &dirs, op).await;
        assert_eq!(got, want, "op #{i} {op:?}");
    }
    for (pi, &d) in dirs.iter().enumerate() {
        let listed: Vec<Vec<u8>> = fs
            .readdir_all(d)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .filter(|n| n != b"x" && n != b"y")
            .collect();
        let expected: Vec<Vec<u8>> = model
            .entries
            .keys()
            .filter(|(p, _)| *p == pi)
            .map(|(_, n)| NAMES[*n].as_bytes().to_vec())
            .collect();
        assert_eq!(listed, expected, "entries of dir #{pi}");
        for (&(p, n), o) in model.entries.iter().filter(|((p, _), _)| *p == pi) {
            let (ino, attr) = fs.lookup(dirs[p], NAMES[n].as_bytes()).await.unwrap();
            match o {
                Obj::Dir => assert_eq!(attr.kind, FileKind::Dir),
                Obj::File(f) => {
                    let (data, nlink) = &model.files[*f];
                    assert_eq!(attr.nlink, *nlink, "nlink of {}", NAMES[n]);
                    assert_eq!(attr.length, data.len() as u64);
                    assert!(
                        integration::read_all(fs, ino).await == *data,
                        "bytes of {} differ",
                        NAMES[n]
                    );
                }
            }
        }
    }
    let live: u64 = model
        .files
        .iter()
        .filter(|(_, l)| *l > 0)
        .map(|(d, _)| d.len() as u64)
        .sum();
    assert_eq!(fs.statfs().await.unwrap().used_space, live);
    // The journal of this run replays to the same state.
    let entries = integration::journal(fs.engine().as_ref()).await;
    let (url, _d) = integration::meta_url("rocksdb");
    let replica = integration::replica(&url).await;
    replica.apply(&entries).await.unwrap();
    assert_eq!(
        fs_core::maint::dump(replica.as_ref()).await.unwrap(),
        fs_core::maint::dump(fs.engine().as_ref()).await.unwrap()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn random_operation_sequences_match_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(check(ops));
    }
}
