//! One file per subcommand group: `run` (the agent), `client` (status, limits: a running
//! agent's admin address), `check` (check-config), `slot`.

pub mod check;
pub mod client;
pub mod run;
pub mod slot;
