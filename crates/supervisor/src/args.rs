//! The supervisor's command line, parsed by hand (a handful of flags, no parser crate
//! in a program that runs inside every sandbox):
//!
//! ```text
//! sandlane-supervisor (--listen-fd FD | --socket PATH | --tcp ADDR)
//!     [--user UID:GID] [--seccomp] [--egress-port PORT] [--file-size-limit BYTES]
//! ```
//!
//! `--tcp` (Kubernetes pods) admits only connections that open with the channel key in
//! the environment variable [`crate::gate::KEY_VARIABLE`].

use std::ffi::OsString;
use std::path::PathBuf;

use crate::SuperviseOptions;
use crate::gate::{ChannelKey, KEY_VARIABLE};

/// The usage line printed with a parse error.
pub const USAGE: &str = "usage: sandlane-supervisor (--listen-fd FD | --socket PATH | --tcp ADDR) [--user UID:GID] \
                         [--seccomp] [--egress-port PORT] [--file-size-limit BYTES]";

/// Parses the arguments after the program's name; `env` reads an environment variable
/// (the channel key of `--tcp`).
///
/// # Errors
/// A message naming the flag that is unknown, repeated, missing its value or malformed,
/// or saying that no listening socket (or more than one) was given.
pub fn parse(
    args: impl IntoIterator<Item = OsString>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<SuperviseOptions, String> {
    let mut options = SuperviseOptions::default();
    let mut tcp = None;
    let mut args = args.into_iter();
    let mut seen = Vec::new();
    while let Some(arg) = args.next() {
        let flag = arg.into_string().map_err(|a| format!("unknown argument {a:?}"))?;
        if seen.contains(&flag) {
            return Err(format!("{flag} given twice"));
        }
        if flag == "--seccomp" {
            options.seccomp = true;
            seen.push(flag);
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let text = || value.to_str().ok_or_else(|| format!("{flag}: {value:?} is not UTF-8"));
        match flag.as_str() {
            "--listen-fd" => options.listen_fd = Some(number(&flag, text()?)?),
            "--socket" => options.socket = Some(PathBuf::from(&value)),
            "--tcp" => {
                let addr = text()?;
                tcp = Some(addr.parse().map_err(|e| format!("--tcp {addr:?}: {e}"))?);
            }
            "--user" => options.user = Some(user(text()?)?),
            "--egress-port" => options.egress_port = Some(number(&flag, text()?)?),
            "--file-size-limit" => options.file_size_limit = Some(number(&flag, text()?)?),
            _ => return Err(format!("unknown argument {flag:?}")),
        }
        seen.push(flag);
    }
    if let Some(addr) = tcp {
        let key = env(KEY_VARIABLE).unwrap_or_default();
        let key = ChannelKey::parse(&key).map_err(|e| format!("--tcp needs {KEY_VARIABLE}: {e}"))?;
        options.tcp = Some((addr, key));
    }
    let sockets = usize::from(options.listen_fd.is_some())
        + usize::from(options.socket.is_some())
        + usize::from(options.tcp.is_some());
    if sockets != 1 {
        return Err("exactly one of --listen-fd, --socket and --tcp is needed".to_owned());
    }
    Ok(options)
}

fn number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|e| format!("{flag} {text:?}: {e}"))
}

fn user(text: &str) -> Result<(u32, u32), String> {
    let (uid, gid) = text.split_once(':').ok_or_else(|| format!("--user: expected UID:GID, got {text:?}"))?;
    Ok((number("--user", uid)?, number("--user", gid)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str], key: Option<&str>) -> Result<SuperviseOptions, String> {
        parse(args.iter().map(OsString::from), |name| {
            (name == KEY_VARIABLE).then(|| key.map(str::to_owned)).flatten()
        })
    }

    #[test]
    fn every_flag_is_read() {
        let o = parse_strs(
            &[
                "--listen-fd",
                "3",
                "--user",
                "1000:1001",
                "--seccomp",
                "--egress-port",
                "3128",
                "--file-size-limit",
                "42",
            ],
            None,
        )
        .unwrap();
        assert_eq!(o.listen_fd, Some(3));
        assert_eq!(o.user, Some((1000, 1001)));
        assert!(o.seccomp);
        assert_eq!(o.egress_port, Some(3128));
        assert_eq!(o.file_size_limit, Some(42));
        let o = parse_strs(&["--socket", "/x/sock"], None).unwrap();
        assert_eq!(o.socket, Some(PathBuf::from("/x/sock")));
        assert!(!o.seccomp);
    }

    #[test]
    fn tcp_needs_a_valid_channel_key() {
        let key = ChannelKey::generate().unwrap();
        let o = parse_strs(&["--tcp", "127.0.0.1:7000"], Some(key.expose())).unwrap();
        assert_eq!(o.tcp.map(|(addr, _)| addr.port()), Some(7000));
        let e = parse_strs(&["--tcp", "127.0.0.1:7000"], None).unwrap_err();
        assert!(e.contains(KEY_VARIABLE), "{e}");
        let e = parse_strs(&["--tcp", "127.0.0.1:7000"], Some("short")).unwrap_err();
        assert!(e.contains(KEY_VARIABLE), "{e}");
    }

    #[test]
    fn bad_command_lines_are_refused_with_a_reason() {
        for (args, says) in [
            (&[][..], "exactly one"),
            (&["--listen-fd", "3", "--socket", "/s"][..], "exactly one"),
            (&["--listen-fd"][..], "needs a value"),
            (&["--listen-fd", "three"][..], "--listen-fd"),
            (&["--listen-fd", "3", "--listen-fd", "4"][..], "twice"),
            (&["--socket", "/s", "--user", "1000"][..], "UID:GID"),
            (&["--socket", "/s", "--egress-port", "70000"][..], "--egress-port"),
            (&["supervise", "--socket", "/s"][..], "unknown argument"),
            (&["--socket", "/s", "--tcp", "nowhere"][..], "--tcp"),
        ] {
            let e = parse_strs(args, None).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e} (expected {says:?})");
        }
    }
}
