//! Two network namespaces joined by a veth pair, to cut and slow a real link between agents.

use super::*;

/// Two network namespaces joined by a veth pair (10.77.N.1 in `a`, 10.77.N.2 in `b`),
/// deleted on drop, also when a test fails.
pub struct NetPair {
    pub a: String,
    pub b: String,
    pub ip_a: String,
    pub ip_b: String,
    veth_a: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("run ip (apt: iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl NetPair {
    /// `tag` keeps pairs of tests running at once apart (0..=9).
    pub fn new(tag: u32) -> NetPair {
        let id = (std::process::id() % 20) * 10 + tag + 20;
        let (a, b) = (format!("jfsA{id}"), format!("jfsB{id}"));
        let (va, vb) = (format!("jva{id}"), format!("jvb{id}"));
        let _ = Command::new("ip").args(["netns", "del", &a]).output();
        let _ = Command::new("ip").args(["netns", "del", &b]).output();
        ip(&["netns", "add", &a]);
        let pair = NetPair {
            a: a.clone(),
            b: b.clone(),
            ip_a: format!("10.77.{id}.1"),
            ip_b: format!("10.77.{id}.2"),
            veth_a: va.clone(),
        };
        ip(&["netns", "add", &b]);
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        ip(&["link", "set", &va, "netns", &a]);
        ip(&["link", "set", &vb, "netns", &b]);
        ip(&[
            "-n",
            &a,
            "addr",
            "add",
            &format!("{}/24", pair.ip_a),
            "dev",
            &va,
        ]);
        ip(&[
            "-n",
            &b,
            "addr",
            "add",
            &format!("{}/24", pair.ip_b),
            "dev",
            &vb,
        ]);
        for (ns, dev) in [(&a, &va), (&b, &vb)] {
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        pair
    }

    /// `ip netns exec NS` as a command prefix.
    pub fn exec(ns: &str) -> Vec<&str> {
        vec!["ip", "netns", "exec", ns]
    }

    /// Cut (down) or restore (up) the link.
    pub fn link(&self, up: bool) {
        ip(&[
            "-n",
            &self.a,
            "link",
            "set",
            &self.veth_a,
            if up { "up" } else { "down" },
        ]);
    }

    /// Run a command inside namespace `a` (e.g. `tc qdisc ...`).
    pub fn in_a(&self, args: &[&str]) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.a])
            .args(args)
            .output()
            .expect("ip netns exec");
        assert!(
            out.status.success(),
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn veth_a(&self) -> &str {
        &self.veth_a
    }
}

impl Drop for NetPair {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.a]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).output();
    }
}
