//! The mirror agents' network side as a peer without a token, a careless operator and a
//! second agent see it (issue 43, items 7 to 9): what a peer that never authenticates can
//! learn and cost, which tokens an agent accepts, and one agent per mirror name and per
//! volume. Real agents as processes; the hostile peer is a raw TCP client that writes the
//! protocol's bytes by hand (`[len u32 BE][crc32c LE][postcard]`), so it checks the bytes on
//! the wire, not the agent's own types.

use integration::mirror::{
    free_port, mirror_toml, primary_toml, status_until, wait_converged, write_files, Agent, Pair,
    ADMIN_TOKEN, TOKEN,
};
use integration::{bin, meta_url, store_url, volume};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

// ---- the protocol's bytes, by hand (postcard: varints, strings as length + bytes) ----

fn varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// A hello of protocol `proto` for `name` asking for a snapshot (protocol 2 had no identity).
fn hello(proto: u32, name: &str) -> Vec<u8> {
    let mut b = Vec::new();
    varint(&mut b, 0); // ToPrimary::Hello
    varint(&mut b, proto.into());
    string(&mut b, name);
    b.push(0); // volume_uuid: None
    b.extend_from_slice(&rand::random::<[u8; 32]>()); // nonce
    varint(&mut b, 1); // Want::Snapshot
    b.push(0); // prev_crc: None
    varint(&mut b, 0); // epoch
    if proto >= 3 {
        string(&mut b, ""); // identity
    }
    b
}

/// An `Auth` with a MAC made without the token.
fn auth() -> Vec<u8> {
    let mut b = Vec::new();
    varint(&mut b, 1); // ToPrimary::Auth
    varint(&mut b, 32);
    b.extend_from_slice(&rand::random::<[u8; 32]>());
    b
}

async fn send(c: &mut TcpStream, body: &[u8]) {
    let mut f = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    f.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    f.extend_from_slice(body);
    c.write_all(&f).await.unwrap();
}

/// The next frame's body (checksum checked), or None at the end of the stream.
async fn recv(c: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    match tokio::time::timeout(Duration::from_secs(15), c.read_exact(&mut len)).await {
        Ok(Ok(_)) => {}
        Ok(Err(_)) => return None,
        Err(_) => panic!("the primary sent nothing for 15 s"),
    }
    let mut f = vec![0u8; u32::from_be_bytes(len) as usize];
    c.read_exact(&mut f).await.unwrap();
    let (crc, body) = f.split_at(4);
    assert_eq!(crc32c::crc32c(body).to_le_bytes(), crc, "a damaged frame");
    Some(body.to_vec())
}

/// A `Refused { reason, resync }` body: the reason.
fn refused_reason(body: &[u8]) -> String {
    assert_eq!(body[0], 1, "not a refusal: {body:?}");
    let n = body[1] as usize; // (reasons here are shorter than 128 bytes... or not)
    let (n, at) = if n < 0x80 {
        (n, 2)
    } else {
        ((n & 0x7f) | ((body[2] as usize) << 7), 3)
    };
    String::from_utf8(body[at..at + n].to_vec()).unwrap()
}

/// The protocol the primary at `listen` speaks, as a hostile peer finds it out: 3, or 2 when
/// it says so (an agent of the release before this change), so that the tests below hold
/// the older agent to the same bytes.
async fn spoken(listen: &str) -> u32 {
    let mut c = TcpStream::connect(listen).await.unwrap();
    send(&mut c, &hello(3, "probe")).await;
    let first = recv(&mut c).await.expect("an answer to the hello");
    if first[0] == 1 && refused_reason(&first).contains("this primary speaks 2") {
        2
    } else {
        3
    }
}

/// One handshake as a peer without the token, in protocol `v`: (the first answer, the
/// refusal, the time from the hello to the refusal, whether the primary then closed). A
/// challenge is answered with a proof made without the token.
async fn try_name(listen: &str, v: u32, name: &str) -> (Vec<u8>, Vec<u8>, Duration, bool) {
    let mut c = TcpStream::connect(listen).await.unwrap();
    let t0 = Instant::now();
    send(&mut c, &hello(v, name)).await;
    let first = recv(&mut c).await.expect("an answer to the hello");
    let second = if first.first() == Some(&0) {
        send(&mut c, &auth()).await;
        recv(&mut c).await.expect("an answer to the proof")
    } else {
        first.clone()
    };
    let took = t0.elapsed();
    let closed = recv(&mut c).await.is_none();
    (first, second, took, closed)
}

fn agent_cmd(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin("mirror-agent"));
    c.args(args).env_remove("MIRROR_TOKEN").stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(40) {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "mirror-agent {args:?} still running after 40 s (it should have refused): {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Item 8: a peer without the token gets, for a registered name, a challenge that depends on
/// nothing secret and then the same refusal, byte for byte and after the same delay, as for
/// a name the primary does not list: nothing to test guesses of the token against offline,
/// and no way to tell which names exist. A peer of the previous protocol is told to upgrade.
/// The real mirror still replicates through the new handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_without_the_token_gets_nothing_to_crack_and_no_names() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume("rocksdb", "file").await;
    write_files(&vol.fs, "a", 2, 50_000).await;
    let pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", "").await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;

    let v = spoken(&pair.listen).await;
    let (k_first, k_refusal, k_took, k_closed) = try_name(&pair.listen, v, "m1").await;
    let (u_first, u_refusal, u_took, u_closed) = try_name(&pair.listen, v, "no-such-mirror").await;
    // The challenge: the variant and the primary's nonce, nothing else (no proof, which a
    // peer could test token guesses against).
    for first in [&k_first, &u_first] {
        assert_eq!(
            (first.len(), first[0]),
            (33, 0),
            "the first answer is not a bare challenge: {first:?}"
        );
    }
    assert_ne!(k_first[1..], u_first[1..], "the nonce is fresh each time");
    // The refusals: identical bytes, after the same delay, then the connection closes.
    assert_eq!(refused_reason(&k_refusal), "authentication failed");
    assert_eq!(
        k_refusal, u_refusal,
        "a registered and an unknown name are refused differently"
    );
    assert!(k_closed && u_closed);
    for took in [k_took, u_took] {
        assert!(took >= Duration::from_millis(200), "refused after {took:?}");
    }

    // The previous protocol's hello: a refusal it can read (variant 1), saying to upgrade.
    let mut c = TcpStream::connect(&pair.listen).await.unwrap();
    send(&mut c, &hello(2, "m1")).await;
    let r = refused_reason(&recv(&mut c).await.unwrap());
    assert!(
        r.contains("protocol 2") && r.contains("upgrade the mirror agent"),
        "{r}"
    );

    // The real mirror (protocol 3, the token on both sides) still replicates.
    write_files(&vol.fs, "b", 2, 50_000).await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
}

/// Item 8: a weak token (repeated characters, a word and a run of digits) and a token file
/// that group or others may read are refused by `check-config` and by `run`, naming what is
/// wrong and how to make a good one; a random token in an owner-only file is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weak_tokens_and_token_files_others_may_read_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (meta, _m) = meta_url("rocksdb");
    let (store, _s) = store_url("file");
    let admin = format!("127.0.0.1:{}", free_port());
    let listen = format!("127.0.0.1:{}", free_port());
    let env_cfg = d.join("mirror-env.toml");
    std::fs::write(
        &env_cfg,
        mirror_toml(&meta, &d.join("st"), &admin, "m1", &listen, &store, ""),
    )
    .unwrap();
    let env_p = d.join("primary-env.toml");
    std::fs::write(
        &env_p,
        primary_toml(&meta, &d.join("pst"), &admin, &listen, &["m1"], ""),
    )
    .unwrap();
    let refused = |cfg: &Path, env: &[(&str, &str)], want: &[&str]| {
        for cmd in [
            vec!["check-config", "--config", s(cfg)],
            vec!["run", "--config", s(cfg)],
        ] {
            let o = agent_cmd(&cmd, env);
            let err = String::from_utf8_lossy(&o.stderr).to_string();
            assert_eq!(o.status.code(), Some(2), "{cmd:?}: {err}");
            for w in want {
                assert!(err.contains(w), "{cmd:?}: no {w:?} in {err}");
            }
            for (_, v) in env {
                if v.len() >= 30 {
                    assert!(!err.contains(v), "the token was shown: {err}");
                }
            }
        }
    };
    for weak in [
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "password1234567890password1234567890",
    ] {
        for cfg in [&env_cfg, &env_p] {
            refused(
                cfg,
                &[("MIRROR_TOKEN", weak), ("ADMIN_TOKEN", ADMIN_TOKEN)],
                &["MIRROR_TOKEN", "is weak", "openssl rand -hex 32"],
            );
        }
    }
    // A weak admin token too.
    refused(
        &env_cfg,
        &[
            ("MIRROR_TOKEN", TOKEN),
            ("ADMIN_TOKEN", "adminadminadminadminadmin123456"),
        ],
        &["admin token", "is weak"],
    );
    // A token file: refused while group or others may read it, taken once it is 0600.
    let tok = d.join("m1.token");
    std::fs::write(&tok, format!("{TOKEN}\n")).unwrap();
    let file_cfg = d.join("mirror-file.toml");
    std::fs::write(
        &file_cfg,
        std::fs::read_to_string(&env_cfg).unwrap().replace(
            "token_env = \"MIRROR_TOKEN\"",
            &format!("token_file = \"{}\"", tok.display()),
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    for mode in [0o644, 0o640] {
        std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(mode)).unwrap();
        refused(
            &file_cfg,
            &[("ADMIN_TOKEN", ADMIN_TOKEN)],
            &[
                s(&tok),
                &format!("mode {mode:04o}"),
                &format!("chmod 600 {}", tok.display()),
            ],
        );
    }
    std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = agent_cmd(
        &["check-config", "--config", s(&file_cfg)],
        &[("ADMIN_TOKEN", ADMIN_TOKEN)],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Item 7: 500 hellos with a 10 KiB name that then fail the proof, and 200 connections that
/// send nothing, grow the primary's log by a few lines (the first refusal, then a summary a
/// minute), never by the names; a real mirror still connects afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unauthenticated_flood_adds_a_few_lines_to_the_primary_log() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume("rocksdb", "file").await;
    write_files(&vol.fs, "a", 2, 50_000).await;
    let mut pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", "").await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    let before = std::fs::metadata(&pair.primary.log).unwrap().len();
    let to: std::net::SocketAddr = pair.listen.parse().unwrap();
    let name = "x".repeat(10 << 10);
    // The idle ones from other addresses, held past the handshake's time limit.
    let mut idle = Vec::new();
    for i in 0..200u32 {
        idle.push(tokio::spawn(async move {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind(([127, 0, 2, (i % 100 + 1) as u8], 0).into())
                .unwrap();
            let c = sock.connect(to).await;
            tokio::time::sleep(Duration::from_secs(12)).await;
            drop(c);
        }));
    }
    // The hellos, 25 at a time from 25 addresses.
    let v = spoken(&pair.listen).await;
    let mut refused = 0;
    for round in 0..20u8 {
        let mut hs = Vec::new();
        for k in 0..25u8 {
            let name = name.clone();
            hs.push(tokio::spawn(async move {
                let sock = tokio::net::TcpSocket::new_v4().unwrap();
                sock.bind(([127, 0, 3, k + 1], 0).into()).unwrap();
                let mut c = sock.connect(to).await.unwrap();
                send(&mut c, &hello(v, &name)).await;
                match recv(&mut c).await {
                    Some(f) if f[0] == 0 => {
                        send(&mut c, &auth()).await;
                        recv(&mut c).await.is_some_and(|b| b[0] == 1)
                    }
                    Some(f) => f[0] == 1,
                    None => false,
                }
            }));
        }
        for h in hs {
            refused += h.await.unwrap() as u32;
        }
        let _ = round;
    }
    assert_eq!(refused, 500, "every bad hello was refused");
    for t in idle {
        t.await.unwrap();
    }
    let grown = std::fs::metadata(&pair.primary.log).unwrap().len() - before;
    assert!(
        grown < 20 << 10,
        "the flood added {grown} bytes to the primary's log:\n{}",
        integration::mirror::tail(&pair.primary.log_text()[before as usize..], 6)
    );
    // The summary comes within a minute of the first line.
    let t0 = Instant::now();
    let summary = loop {
        let log = pair.primary.log_text();
        let tail = &log[before as usize..];
        if let Some(l) = tail.lines().find(|l| {
            l.contains("unauthenticated connections in the last")
                && l.split_whitespace()
                    .skip_while(|w| *w != "refused")
                    .nth(1)
                    .and_then(|n| n.parse::<u64>().ok())
                    .is_some_and(|n| n >= 100)
        }) {
            break l.to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "no summary line in 90 s; the log grew by:\n{}",
            integration::mirror::tail(tail, 20)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(summary.contains("authentication failed"), "{summary}");
    let log = pair.primary.log_text();
    let grown = log.len() as u64 - before;
    eprintln!("the flood added {grown} bytes to the primary's log; its summary: {summary}");
    assert!(
        grown < 20 << 10,
        "the flood added {grown} bytes to the primary's log:\n{}",
        integration::mirror::tail(&log[before as usize..], 20)
    );
    assert!(!log.contains(&"x".repeat(100)), "a name was logged in full");
    // A real mirror still connects and replicates.
    pair.mirror.kill9();
    write_files(&vol.fs, "b", 2, 50_000).await;
    pair.mirror.restart();
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
}

/// Item 9: a second mirror agent with the name of a running one (its own metadata) is refused
/// loudly at the primary and at that agent, and the first keeps its connection (before, the
/// two took turns on the slot, each only logging "connection lost"). The operator's reset
/// (`slot drop`) lets a new copy take the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_mirror_agent_with_one_name_is_refused_and_the_first_keeps_the_slot() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let vol = volume("rocksdb", "file").await;
    write_files(&vol.fs, "a", 2, 50_000).await;
    let mut pair = Pair::start(d, &vol.meta_url, "rocksdb", None, "", "").await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    let lost_before = pair.mirror.log_text().matches("connection lost").count();
    let (meta2, _m2) = meta_url("rocksdb");
    let (store2, _s2) = store_url("file");
    let mut second = Agent::start(
        d,
        "second",
        &mirror_toml(
            &meta2,
            &d.join("st2"),
            &format!("127.0.0.1:{}", free_port()),
            "m1",
            &pair.listen,
            &store2,
            "",
        ),
        &[("MIRROR_TOKEN", TOKEN)],
    );
    let st = status_until(&second, Duration::from_secs(30), |st| {
        st["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("held by another copy of its metadata"))
    })
    .await;
    assert_eq!(st["connected"], false, "{st}");
    assert!(second.log_text().contains("ERROR"), "not loud at the agent");
    let plog = pair.primary.log_text();
    assert!(
        plog.lines()
            .any(|l| l.contains("ERROR") && l.contains("held by another copy of its metadata")),
        "not loud at the primary:\n{}",
        integration::mirror::tail(&plog, 10)
    );
    // The first stays connected and replicates, never losing its connection meanwhile.
    for _ in 0..20 {
        assert_eq!(pair.mirror.status()["connected"], true);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    write_files(&vol.fs, "b", 2, 50_000).await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    assert_eq!(
        pair.mirror.log_text().matches("connection lost").count(),
        lost_before,
        "the first mirror lost its connection"
    );
    // The slot records the first copy.
    let o = agent_cmd(&["slot", "list", "--meta", &vol.meta_url, "--json"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let holder = &v["slots"][0]["holder"];
    assert!(
        holder["identity"].as_str().is_some_and(|i| i.len() == 32),
        "{v}"
    );

    // The first mirror is retired and its slot dropped by the operator: the second takes
    // the slot and bootstraps.
    assert_eq!(pair.mirror.term(), 0);
    let o = agent_cmd(
        &[
            "slot",
            "drop",
            "m1",
            "--meta",
            &vol.meta_url,
            "--config",
            s(&pair.primary.cfg),
        ],
        &[("ADMIN_TOKEN", ADMIN_TOKEN)],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    second.kill9();
    second.restart();
    wait_converged(&second, &**vol.fs.engine(), Duration::from_secs(60)).await;
    integration::mirror::assert_same(&vol.fs, &meta2, &store2).await;
}

/// Item 9: a second primary agent on a volume (another port, admin address and state
/// directory) refuses to start, naming the one that serves it; before, both served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_primary_agent_on_one_volume_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let vol = volume("rocksdb", "file").await;
    write_files(&vol.fs, "a", 1, 10_000).await;
    let pair = Pair::start(d, &vol.meta_url, "rocksdb", None, "", "").await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    let cfg = d.join("primary2.toml");
    std::fs::write(
        &cfg,
        primary_toml(
            &vol.meta_url,
            &d.join("pstate2"),
            &format!("127.0.0.1:{}", free_port()),
            &format!("127.0.0.1:{}", free_port()),
            &["m1"],
            "",
        ),
    )
    .unwrap();
    let o = agent_cmd(
        &["run", "--config", s(&cfg)],
        &[("MIRROR_TOKEN", TOKEN), ("ADMIN_TOKEN", ADMIN_TOKEN)],
    );
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("another primary agent serves this volume")
            && err.contains(&format!("pid {}", pair.primary.pid()))
            && err.contains(&pair.listen),
        "{err}"
    );
    // The first one goes on serving.
    write_files(&vol.fs, "b", 1, 10_000).await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
}
