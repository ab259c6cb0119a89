//! `sandlane-supervisor`: PID 1 of every sandbox. Its command line is [`supervisor::args`];
//! the drivers start it, nobody else needs to.

use std::process::ExitCode;

fn main() -> ExitCode {
    let options = match supervisor::args::parse(std::env::args_os().skip(1), |name| std::env::var(name).ok())
    {
        Ok(options) => options,
        Err(e) => {
            supervisor::diagnose(format_args!("{e}\n{}", supervisor::args::USAGE));
            return ExitCode::from(64);
        }
    };
    let code = supervisor::supervise(&options);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
