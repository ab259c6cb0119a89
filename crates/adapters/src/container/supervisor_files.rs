//! The supervisor's program and what it needs to run in an image that has nothing of
//! ours: the binary, its ELF loader and its shared libraries, as `ldd` resolves them on
//! this host, each bound read-only into the container.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The files a container needs to run the supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupervisorFiles {
    binary: PathBuf,
    loader: Option<PathBuf>,
    libraries: Vec<PathBuf>,
}

impl SupervisorFiles {
    /// Resolves `binary`'s loader and libraries with `ldd`. A static binary needs none.
    ///
    /// # Errors
    /// A message when the binary is missing or `ldd` cannot resolve it.
    pub fn resolve(binary: &Path) -> Result<Self, String> {
        if !binary.is_file() {
            return Err(format!(
                "the supervisor program {} does not exist (it is the `sandlane-supervisor` program, built beside `sandlane`)",
                binary.display()
            ));
        }
        let out = Command::new("ldd")
            .arg(binary)
            .env_clear()
            .output()
            .map_err(|e| format!("cannot run ldd on {}: {e}", binary.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            if text.contains("not a dynamic executable")
                || String::from_utf8_lossy(&out.stderr).contains("not a dynamic")
            {
                return Ok(Self { binary: binary.to_owned(), loader: None, libraries: Vec::new() });
            }
            return Err(format!(
                "ldd cannot resolve {}: {}",
                binary.display(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Self::parse(binary, &text)
    }

    /// Reads `ldd`'s output.
    fn parse(binary: &Path, ldd: &str) -> Result<Self, String> {
        let mut loader = None;
        let mut libraries = Vec::new();
        for line in ldd.lines().map(str::trim) {
            let path = |s: &str| s.split_whitespace().next().map(PathBuf::from);
            if line.contains("not found") {
                return Err(format!("{} needs a library this host lacks: {line}", binary.display()));
            }
            if let Some((_, right)) = line.split_once("=>") {
                if let Some(p) = path(right).filter(|p| p.is_absolute()) {
                    libraries.push(p);
                }
            } else if let Some(p) = path(line).filter(|p| p.is_absolute()) {
                loader = Some(p);
            }
        }
        if loader.is_none() && !libraries.is_empty() {
            return Err(format!("ldd names no loader for {}", binary.display()));
        }
        Ok(Self { binary: binary.to_owned(), loader, libraries })
    }

    /// How many host files are bound.
    pub fn count(&self) -> usize {
        1 + usize::from(self.loader.is_some()) + self.libraries.len()
    }

    /// The read-only binds under `inside` (`/.sandlane`): `sandlane`, `ld.so`, `lib/…`.
    pub fn binds(&self, inside: &str) -> Vec<String> {
        let mut binds = vec![format!("{}:{inside}/{}:ro", self.binary.display(), supervisor::PROGRAM)];
        if let Some(loader) = &self.loader {
            binds.push(format!("{}:{inside}/ld.so:ro", loader.display()));
        }
        for lib in &self.libraries {
            if let Some(name) = lib.file_name() {
                binds.push(format!("{}:{inside}/lib/{}:ro", lib.display(), name.to_string_lossy()));
            }
        }
        binds
    }

    /// The container's entrypoint: the supervisor (through the bound loader when
    /// dynamic), listening in `<inside>/control`, commands run as `user`; with
    /// `egress_port`, listening on the egress proxy's port itself (where the server
    /// cannot open that socket in the container's namespace).
    pub fn entrypoint(&self, inside: &str, user: &str, egress_port: bool) -> Vec<String> {
        let mut argv = Vec::new();
        if self.loader.is_some() {
            argv.extend([format!("{inside}/ld.so"), "--library-path".to_owned(), format!("{inside}/lib")]);
        }
        argv.extend([
            format!("{inside}/{}", supervisor::PROGRAM),
            "--socket".to_owned(),
            format!("{inside}/control/sock"),
            "--user".to_owned(),
            user.to_owned(),
            "--seccomp".to_owned(),
        ]);
        if egress_port {
            // The egress proxy on the container's own loopback (its network is `none`).
            argv.extend(["--egress-port".to_owned(), domain::egress::PROXY_PORT.to_string()]);
        }
        argv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_becomes_binds_and_an_entrypoint() {
        let ldd = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x1)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n\t/lib64/ld-linux-x86-64.so.2 (0x3)\n";
        let files = SupervisorFiles::parse(Path::new("/usr/bin/sandlane-supervisor"), ldd).unwrap();
        assert_eq!(files.count(), 4);
        assert_eq!(
            files.binds("/.s"),
            [
                "/usr/bin/sandlane-supervisor:/.s/sandlane-supervisor:ro",
                "/lib64/ld-linux-x86-64.so.2:/.s/ld.so:ro",
                "/lib/x86_64-linux-gnu/libgcc_s.so.1:/.s/lib/libgcc_s.so.1:ro",
                "/lib/x86_64-linux-gnu/libc.so.6:/.s/lib/libc.so.6:ro",
            ]
        );
        assert_eq!(
            files.entrypoint("/.s", "1000:1000", false)[..4],
            ["/.s/ld.so", "--library-path", "/.s/lib", "/.s/sandlane-supervisor"]
        );
        assert!(SupervisorFiles::parse(Path::new("/x"), "\tlibfoo.so => not found\n").is_err());
    }
}
