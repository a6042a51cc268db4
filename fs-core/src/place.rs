//! The places a store, a directory or a volume occupies, and whether two overlap: the one
//! overlap check of the workspace (a sync's SRC and DST, a cutover's old and new store).
//!
//! SRC and DST must never overlap: a destination inside its source (or the other way round)
//! copies into what is being listed and, with `--delete-dst` or `--delete-src`, deletes from
//! what is being copied. Every endpoint is reduced to the places it reads or writes, and two
//! places overlap when they are the same store and one path is a prefix of the other, by
//! whole components:
//!
//! - a local directory, with symlinks and `..` resolved as far as the path exists (the rest is
//!   normalised as written), so `a`, `./a/../a` and a symlink to `a` are the same place;
//! - an object store prefix, identified by service, endpoint and bucket (`s3://b/p` and
//!   `opendal+s3://?bucket=b&root=/p` alike); `opendal+fs` is a local directory;
//! - a path in a volume, identified by its metadata (before opening) and its uuid (after), plus
//!   what the volume itself lives in: its RocksDB directory and its blocks' prefix.

use std::path::{Component, Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// An absolute, normalised local path.
    Local(PathBuf),
    /// A prefix (components joined by '/', "" = the whole bucket) in one store.
    Object { store: String, prefix: String },
    /// A path in a volume identified by `id` (its uuid, or its metadata's identity).
    Volume { id: String, path: String },
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Local(p) => write!(f, "{}", p.display()),
            Place::Object { store, prefix } => write!(f, "{store}/{prefix}"),
            Place::Volume { id, path } => write!(f, "volume {id} path /{path}"),
        }
    }
}

/// Is `a` equal to `b` or inside it, by whole components?
fn within(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim_matches('/'), b.trim_matches('/'));
    b.is_empty() || a == b || a.strip_prefix(b).is_some_and(|r| r.starts_with('/'))
}

/// The (device, inode) of the nearest existing directory at or above `p`, and of each of its
/// ancestors: what `p` is inside of, whatever path names it.
fn inode_chain(p: &Path) -> Vec<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut cur = Some(p);
    while let Some(c) = cur {
        if let Ok(m) = std::fs::metadata(c) {
            out.push((m.dev(), m.ino()));
        }
        cur = c.parent();
    }
    out
}

/// Local paths that overlap although neither path is a prefix of the other: the same
/// directory reached through a bind mount (same device and inode under another path).
fn by_inode(x: &Path, y: &Path) -> Option<&'static str> {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let (cx, cy) = (inode_chain(x), inode_chain(y));
    match (id(x), id(y)) {
        (Some(a), Some(b)) if a == b => Some("is the same place as"),
        (_, Some(b)) if cx.contains(&b) => Some("is inside"),
        (Some(a), _) if cy.contains(&a) => Some("contains"),
        _ => None,
    }
}

/// How `a` and `b` overlap, if they do ("the same", "inside").
fn relation(a: &Place, b: &Place) -> Option<&'static str> {
    let nested = |x: &str, y: &str| {
        if within(x, y) && within(y, x) {
            Some("is the same place as")
        } else if within(x, y) {
            Some("is inside")
        } else if within(y, x) {
            Some("contains")
        } else {
            None
        }
    };
    match (a, b) {
        (Place::Local(x), Place::Local(y)) => {
            nested(&x.to_string_lossy(), &y.to_string_lossy()).or_else(|| by_inode(x, y))
        }
        (
            Place::Object {
                store: s1,
                prefix: p1,
            },
            Place::Object {
                store: s2,
                prefix: p2,
            },
        ) if s1 == s2 => nested(p1, p2),
        (Place::Volume { id: i1, path: p1 }, Place::Volume { id: i2, path: p2 }) if i1 == i2 => {
            nested(p1, p2)
        }
        _ => None,
    }
}

/// The first overlap between any place of the source and any of the destination, as a
/// sentence for the error message.
pub fn find(src: &[(String, Place)], dst: &[(String, Place)]) -> Option<String> {
    for (sw, s) in src {
        for (dw, d) in dst {
            if let Some(rel) = relation(d, s) {
                return Some(format!(
                    "the destination's {dw} ({d}) {rel} the source's {sw} ({s})"
                ));
            }
        }
    }
    None
}

/// Is some place of `a` the same place as some place of `b`?
pub fn same(a: &[(String, Place)], b: &[(String, Place)]) -> bool {
    a.iter().any(|(_, x)| {
        b.iter()
            .any(|(_, y)| relation(x, y) == Some("is the same place as"))
    })
}

/// What an endpoint is, beyond its spelling, for keying its resume state and comparing the
/// workers of a shared job: `volume path uuid X path /p` for a volume (from `opened`, the
/// places of the opened endpoint), `directory /abs/resolved` for a local directory,
/// `prefix STORE/PREFIX` for an object store (service, endpoint, bucket), else the spec.
pub fn identity(spec: &str, endpoint_flag: Option<&str>, opened: &[(String, Place)]) -> String {
    let (what, place) = match opened.first() {
        Some(p) => p.clone(),
        None => match of_spec(spec, endpoint_flag).into_iter().next() {
            Some(p) => p,
            None => return format!("spec {spec}"),
        },
    };
    format!("{what} {place}")
}

/// An absolute local path with `.`/`..` resolved and symlinks resolved as far as it exists.
pub fn local(path: &str) -> PathBuf {
    let p = Path::new(path);
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .unwrap_or_else(|_| PathBuf::from("/"))
            .join(p)
    };
    // Walk down, resolving each existing prefix (canonicalize follows symlinks and `..`), and
    // normalise the part that does not exist yet lexically.
    let mut out = PathBuf::from("/");
    let mut exists = true;
    for c in abs.components() {
        match c {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => {
                out.push(n);
                if exists {
                    match std::fs::canonicalize(&out) {
                        Ok(c) => out = c,
                        Err(_) => exists = false,
                    }
                }
            }
        }
    }
    out
}

fn norm_endpoint(e: &str) -> String {
    e.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// Keys of `opendal+` options that name credentials, not places.
const SECRET_KEYS: &[&str] = &[
    "access_key_id",
    "secret_access_key",
    "session_token",
    "account_key",
    "sas_token",
    "credential",
    "credential_path",
    "password",
    "username",
    "token",
];

/// The places an endpoint spec names, before anything is opened (no I/O but `canonicalize`).
/// `jfs://NAME/path` is identified by its metadata URL here; `volume_places` refines it
/// once the volume is open.
pub fn of_spec(spec: &str, endpoint_flag: Option<&str>) -> Vec<(String, Place)> {
    let here = |p: Place| vec![("directory".to_string(), p)];
    let Some((scheme, rest)) = spec.split_once("://") else {
        return here(Place::Local(local(spec)));
    };
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let params: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    match scheme {
        "file" => here(Place::Local(local(path))),
        "memory" => Vec::new(), // private to this process
        "s3" => {
            let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
            let ep = endpoint_flag
                .map(str::to_string)
                .or_else(|| param("endpoint"))
                .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
                .unwrap_or_else(|| "aws".into());
            vec![(
                "prefix".into(),
                Place::Object {
                    store: format!("s3 {} bucket {bucket}", norm_endpoint(&ep)),
                    prefix: prefix.trim_matches('/').to_string(),
                },
            )]
        }
        "jfs" => {
            let (name, vpath) = path.split_once('/').unwrap_or((path, ""));
            match std::env::var(name) {
                Ok(url) => meta_places(&url, vpath),
                Err(_) => Vec::new(), // opening it reports the missing variable
            }
        }
        s if s.starts_with("opendal+") => {
            let service = &s["opendal+".len()..];
            let root = param("root").unwrap_or_default();
            if service == "fs" {
                return here(Place::Local(local(&root)));
            }
            let store = if service == "s3" {
                format!(
                    "s3 {} bucket {}",
                    norm_endpoint(&param("endpoint").unwrap_or_else(|| "aws".into())),
                    param("bucket").unwrap_or_default()
                )
            } else {
                let mut id: Vec<String> = params
                    .iter()
                    .filter(|(k, _)| k != "root" && !SECRET_KEYS.contains(&k.as_str()))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                id.sort();
                format!("{service} {}", id.join("&"))
            };
            vec![(
                "prefix".into(),
                Place::Object {
                    store,
                    prefix: root.trim_matches('/').to_string(),
                },
            )]
        }
        _ => Vec::new(), // opening it reports the unknown scheme
    }
}

/// A volume named by its metadata URL, before it is opened: the same metadata is the same
/// volume (RocksDB by its resolved directory, Redis by server, db and prefix, PostgreSQL by
/// server, database and schema), and a RocksDB directory is a local place too.
/// A volume path as the volume resolves it (`a/../b` is `b`), for comparing places; one that
/// climbs above the root is left as given (opening it refuses it).
fn in_volume(vpath: &str) -> String {
    match crate::VolPath::parse(vpath) {
        Ok(p) => p.to_string().trim_start_matches('/').to_string(),
        Err(_) => vpath.trim_matches('/').to_string(),
    }
}

pub fn meta_places(url: &str, vpath: &str) -> Vec<(String, Place)> {
    let vpath = in_volume(vpath);
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut out = Vec::new();
    let id = match scheme {
        "rocksdb" => {
            let dir = local(path);
            out.push(("metadata directory".to_string(), Place::Local(dir.clone())));
            format!("rocksdb {}", dir.display())
        }
        _ => {
            let mut q: Vec<&str> = query
                .split('&')
                .filter(|p| p.starts_with("prefix=") || p.starts_with("schema="))
                .collect();
            q.sort();
            let host = path.rsplit_once('@').map_or(path, |(_, h)| h);
            format!("{scheme} {} {}", host.to_ascii_lowercase(), q.join("&"))
        }
    };
    out.insert(
        0,
        ("volume path".to_string(), Place::Volume { id, path: vpath }),
    );
    out
}

/// The places of an open volume: its path by uuid, and where its blocks live (under
/// `<store>/<volume name>/`, so two volumes sharing a bucket do not overlap).
pub fn volume_places(uuid: &str, name: &str, storage: &str, vpath: &str) -> Vec<(String, Place)> {
    let mut out = vec![(
        "volume path".to_string(),
        Place::Volume {
            id: format!("uuid {uuid}"),
            path: in_volume(vpath),
        },
    )];
    for (_, p) in of_spec(storage, None) {
        let p = match p {
            Place::Local(d) => Place::Local(d.join(name)),
            Place::Object { store, prefix } => Place::Object {
                prefix: if prefix.is_empty() {
                    name.to_string()
                } else {
                    format!("{prefix}/{name}")
                },
                store,
            },
            v => v,
        };
        out.push(("block store".to_string(), p));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(src: &str, dst: &str, overlap: bool) {
        let (s, d) = (of_spec(src, None), of_spec(dst, None));
        assert_eq!(
            find(&s, &d).is_some(),
            overlap,
            "{src} -> {dst}: {:?}",
            find(&s, &d)
        );
    }

    #[test]
    fn nested_local_paths_overlap_either_way() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path().display().to_string();
        std::fs::create_dir_all(t.path().join("ov/a")).unwrap();
        std::fs::create_dir_all(t.path().join("other")).unwrap();
        std::os::unix::fs::symlink(t.path().join("ov"), t.path().join("alias")).unwrap();
        check(&format!("{r}/ov"), &format!("{r}/ov/a"), true);
        check(&format!("{r}/ov/a"), &format!("{r}/ov"), true);
        check(&format!("{r}/ov"), &format!("{r}/ov/"), true);
        check(&format!("{r}/ov"), &format!("{r}/ov/a/../."), true);
        check(&format!("{r}/ov"), &format!("{r}/alias/new/x"), true);
        check(&format!("{r}/ov"), &format!("file://{r}/ov/not/yet"), true);
        check(
            &format!("{r}/ov"),
            &format!("opendal+fs://?root={r}/ov/x"),
            true,
        );
        check(&format!("{r}/ov"), &format!("{r}/other/../ov2"), false);
        check(&format!("{r}/ov"), &format!("{r}/ovx"), false);
        check(&format!("{r}/ov"), &format!("{r}/other"), false);
        check(&format!("{r}/ov"), "memory://", false);
    }

    #[test]
    fn object_prefixes_overlap_within_one_bucket_and_endpoint() {
        let e = "?endpoint=http://127.0.0.1:7480";
        check(&format!("s3://b/p{e}"), &format!("s3://b/p/q{e}"), true);
        check(&format!("s3://b/p/q{e}"), &format!("s3://b{e}"), true);
        check(&format!("s3://b/p{e}"), &format!("s3://b/p/{e}"), true);
        check(
            &format!("s3://b/p{e}"),
            "opendal+s3://?bucket=b&root=/p/x&endpoint=http://127.0.0.1:7480/",
            true,
        );
        check(&format!("s3://b/p{e}"), &format!("s3://b/pq{e}"), false);
        check(&format!("s3://b/p{e}"), &format!("s3://c/p{e}"), false);
        check(
            &format!("s3://b/p{e}"),
            "s3://b/p?endpoint=http://10.0.0.9:7480",
            false,
        );
    }

    #[test]
    fn volumes_overlap_by_metadata_and_by_what_they_live_in() {
        let a = meta_places("redis://127.0.0.1:6379/1?prefix=v", "data");
        let b = meta_places("redis://127.0.0.1:6379/1?prefix=v", "data/sub");
        let c = meta_places("redis://127.0.0.1:6379/1?prefix=w", "data/sub");
        assert!(find(&a, &b).is_some());
        assert!(find(&a, &c).is_none());
        // Paths as the volume resolves them: data/x/.. is data, a/../data/sub is in it.
        let up = meta_places("redis://127.0.0.1:6379/1?prefix=v", "data/x/..");
        let back = meta_places("redis://127.0.0.1:6379/1?prefix=v", "a/../data/sub");
        assert!(find(&up, &b).is_some() && find(&a, &back).is_some());
        assert!(find(
            &meta_places("redis://127.0.0.1:6379/1?prefix=v", "other/.."),
            &b
        )
        .is_some());
        let u1 = volume_places("u1", "vol", "file:///srv/store", "x");
        let u2 = volume_places("u1", "vol", "file:///srv/store", "x/y");
        assert!(find(&u1, &u2).is_some());
        // Copying a tree into a volume whose blocks live inside that tree.
        let srcdir = vec![("directory".to_string(), Place::Local("/srv".into()))];
        assert!(find(&srcdir, &u1).is_some());
        // Two volumes sharing a bucket are separate places.
        let other = volume_places("u2", "vol2", "file:///srv/store", "");
        assert!(find(&u1, &other).is_none());
    }
}
