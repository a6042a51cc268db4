//! A primary agent and a mirror agent started together, on loopback (optionally through a
//! proxy) or across network namespaces.

use super::*;

/// A primary agent on a volume and a mirror agent (its own metadata on `m_engine`, its own
/// file store) on loopback, the mirror connecting through a harness [`Proxy`] when asked.
pub struct Pair {
    pub primary: Agent,
    pub mirror: Agent,
    pub proxy: Option<Proxy>,
    pub listen: String,
    pub m_meta: String,
    pub m_store: String,
    _keep: Vec<tempfile::TempDir>,
}

/// Where a [`Pair`] runs: loopback (optionally through a harness [`Proxy`]), or the primary
/// in namespace `a` and the mirror in namespace `b` of a [`NetPair`], on fixed ports.
pub enum Placement<'a> {
    Loopback { proxy: Option<(Duration, u32)> },
    Netns { net: &'a NetPair, port: u16 },
}

impl Pair {
    /// On loopback; `proxy`: (delay each way, stalls per mille). `*_extra`: TOML lines for
    /// the `[primary]` / `[mirror]` sections.
    pub async fn start(
        dir: &Path,
        meta: &str,
        m_engine: &str,
        proxy: Option<(Duration, u32)>,
        primary_extra: &str,
        mirror_extra: &str,
    ) -> Pair {
        Self::start_at(
            dir,
            meta,
            m_engine,
            Placement::Loopback { proxy },
            primary_extra,
            mirror_extra,
        )
        .await
    }

    pub async fn start_at(
        dir: &Path,
        meta: &str,
        m_engine: &str,
        at: Placement<'_>,
        primary_extra: &str,
        mirror_extra: &str,
    ) -> Pair {
        // The run directory of the test's mounts (`Mount::start`): a primary agent of a
        // RocksDB volume reaches the writing mount's control socket there.
        let run_dir = dir.join("run").display().to_string();
        let env = [("MIRROR_TOKEN", TOKEN), ("JFS_RUN_DIR", run_dir.as_str())];
        // (listen, primary admin, mirror admin, primary prefix, mirror prefix)
        let (listen, p_admin, m_admin, p_pre, m_pre) = match &at {
            Placement::Loopback { .. } => {
                let a = || format!("127.0.0.1:{}", free_port());
                (a(), a(), a(), vec![], vec![])
            }
            Placement::Netns { net, port } => (
                format!("{}:{port}", net.ip_a),
                format!("127.0.0.1:{}", port + 1),
                format!("127.0.0.1:{}", port + 2),
                NetPair::exec(&net.a),
                NetPair::exec(&net.b),
            ),
        };
        // Across namespaces the link is "a network": plaintext there is an explicit choice.
        let plain = if matches!(at, Placement::Netns { .. }) {
            "insecure_plaintext = true\n"
        } else {
            ""
        };
        let ptoml = primary_toml(
            meta,
            &dir.join("pstate"),
            &p_admin,
            &listen,
            &["m1"],
            &format!("{plain}{primary_extra}"),
        );
        let primary = Agent::start_with(dir, "primary", &ptoml, &env, &p_pre);
        let proxy = match at {
            Placement::Loopback {
                proxy: Some((d, stalls)),
            } => Some(Proxy::start(listen.clone(), d, stalls).await),
            _ => None,
        };
        let target = proxy.as_ref().map_or(listen.clone(), |p| p.addr.clone());
        let (m_meta, d1) = crate::meta_url(m_engine);
        let (m_store, d2) = crate::store_url("file");
        let mtoml = mirror_toml(
            &m_meta,
            &dir.join("mstate"),
            &m_admin,
            "m1",
            &target,
            &m_store,
            &format!("{plain}{mirror_extra}"),
        );
        let mirror = Agent::start_with(dir, "mirror", &mtoml, &env, &m_pre);
        Pair {
            primary,
            mirror,
            proxy,
            listen,
            m_meta,
            m_store,
            _keep: d1.into_iter().chain(d2).collect(),
        }
    }
}
