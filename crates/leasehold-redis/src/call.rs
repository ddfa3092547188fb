//! Script calls built straight into the command's buffer: keys, tenures and numbers are written
//! where they go, sized up front, with no intermediate strings (formatting a key with `format!`
//! and growing the command as arguments arrive cost more than the rest of the client's work).

use std::io::Write as _;

use leasehold::{FencingToken, HolderId};
use redis::{Cmd, RedisWrite, ToRedisArgs};

use crate::scripts::LuaScript;

/// Suffix of a lease key.
pub(crate) const LEASE: &str = "lease";
/// Suffix of a fencing counter key.
pub(crate) const FENCE: &str = "fence";
/// Suffix of a slot key.
pub(crate) const SLOT: &str = "slot";
/// Suffix of a history key.
pub(crate) const HISTORY: &str = "history";
/// Suffix of a membership key.
pub(crate) const MEMBERS: &str = "members";
/// Suffix of a task's catalog record (definition and control record).
pub(crate) const TASK: &str = "task";
/// Suffix of a task's instances (heartbeats).
pub(crate) const INSTANCES: &str = "instances";
/// The hash tag of the catalog's index of task names: not a lease name (`#` is not allowed in
/// one), so it never meets a name's keys.
pub(crate) const CATALOG: &str = "#catalog";
/// Suffix of the catalog's index of task names.
pub(crate) const TASKS: &str = "tasks";

/// The pieces of `<prefix>:{<name>}:<kind>`: the braces are a hash tag, so a name's keys share a
/// Redis Cluster slot.
pub(crate) fn key_parts<'a>(prefix: &'a str, name: &'a str, kind: &'static str) -> [&'a str; 5] {
    [prefix, ":{", name, "}:", kind]
}

/// One key or argument of a script call.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Str(&'a str),
    Int(u64),
    /// One of a name's keys (see [`key_parts`]).
    Key {
        prefix: &'a str,
        name: &'a str,
        kind: &'static str,
    },
    /// `<token> <holder>`: what a lease key holds during that tenure.
    Tenure(FencingToken, &'a HolderId),
}

/// Decimal digits of `n`, right-aligned in `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

impl Arg<'_> {
    /// The argument's size in bytes (an upper bound for numbers).
    fn len(&self) -> usize {
        match self {
            Self::Str(s) => s.len(),
            Self::Int(_) => 20,
            Self::Key { prefix, name, kind } => prefix.len() + name.len() + kind.len() + 4,
            Self::Tenure(_, holder) => 21 + holder.as_str().len(),
        }
    }
}

impl ToRedisArgs for Arg<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut digits = [0; 20];
        match *self {
            Self::Str(s) => out.write_arg(s.as_bytes()),
            Self::Int(n) => out.write_arg(decimal(n, &mut digits)),
            Self::Key { prefix, name, kind } => {
                let mut w = out.writer_for_next_arg();
                for part in key_parts(prefix, name, kind) {
                    // Writing into the command's Vec cannot fail.
                    let _ = w.write_all(part.as_bytes());
                }
            }
            Self::Tenure(token, holder) => {
                let mut w = out.writer_for_next_arg();
                let _ = w.write_all(decimal(token.get(), &mut digits));
                let _ = w.write_all(b" ");
                let _ = w.write_all(holder.as_str().as_bytes());
            }
        }
    }
}

/// The command `args` (the command's name first), allocated once at its final size.
pub(crate) fn plain_cmd(args: &[Arg]) -> Cmd {
    let mut cmd = Cmd::with_capacity(args.len(), args.iter().map(Arg::len).sum());
    cmd.arg(args);
    cmd
}

/// `EVALSHA <hash> <numkeys> <keys…> <args…>`, or `EVAL <code> …` when `by_hash` is false, in a
/// command allocated once at its final size.
pub(crate) fn script_cmd(script: &LuaScript, by_hash: bool, keys: &[Arg], args: &[Arg]) -> Cmd {
    let (command, body) = if by_hash {
        ("EVALSHA", script.hash.as_str())
    } else {
        ("EVAL", script.code.as_str())
    };
    let size =
        command.len() + body.len() + 20 + keys.iter().chain(args).map(Arg::len).sum::<usize>();
    let mut cmd = Cmd::with_capacity(3 + keys.len() + args.len(), size);
    cmd.arg(command)
        .arg(body)
        .arg(Arg::Int(keys.len() as u64))
        .arg(keys)
        .arg(args);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(arg: redis::Arg<&[u8]>) -> Vec<u8> {
        match arg {
            redis::Arg::Simple(b) => b.to_vec(),
            _ => b"<not a simple argument>".to_vec(),
        }
    }

    #[test]
    fn arguments_are_written_as_the_scripts_expect() {
        let holder = HolderId::new("h-1").unwrap();
        let script = LuaScript::new("return 1");
        let keys = [Arg::Key {
            prefix: "p",
            name: "job:7",
            kind: LEASE,
        }];
        let args = [
            Arg::Tenure(FencingToken(1_796_000_000_000_000_001), &holder),
            Arg::Int(0),
            Arg::Int(u64::MAX),
            Arg::Str("x y"),
        ];
        let cmd = script_cmd(&script, true, &keys, &args);
        let written: Vec<Vec<u8>> = cmd.args_iter().map(bytes).collect();
        let expected: Vec<Vec<u8>> = [
            "EVALSHA",
            script.hash.as_str(),
            "1",
            "p:{job:7}:lease",
            "1796000000000000001 h-1",
            "0",
            "18446744073709551615",
            "x y",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
        assert_eq!(written, expected);
        assert_eq!(key_parts("p", "job:7", FENCE).concat(), "p:{job:7}:fence");
        let eval = script_cmd(&script, false, &keys, &[]);
        assert_eq!(
            eval.args_iter().nth(1).map(bytes),
            Some(script.code.as_bytes().to_vec())
        );
    }
}
