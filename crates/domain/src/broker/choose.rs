//! Which secrets a connection carries: for the caller the sandbox acts for and the host and
//! port it asked for, the secrets in scope that name that host; per header, the best fit
//! (an identity scope beats a class scope beats the org's; between equals, the first name).

use std::collections::BTreeMap;

use super::Injection;
use super::binding::SecretBinding;
use crate::caller::SandboxCaller;
use crate::secret::SecretValue;

/// The injections for `caller` on `host` (as `normalize_host` gives it) and `port`, one per
/// header name, ordered by header name; empty when no secret applies. `in_clear`: the
/// request goes as plain HTTP, so only bindings that name `port` themselves apply
/// ([`SecretBinding::covers_in_clear`]).
pub fn choose(
    secrets: &[(SecretBinding, SecretValue)],
    caller: &SandboxCaller,
    host: &str,
    port: u16,
    in_clear: bool,
) -> Vec<Injection> {
    let mut best: BTreeMap<&str, (u8, &SecretBinding, &SecretValue)> = BTreeMap::new();
    for (binding, value) in secrets {
        let Some(rank) = binding.scope.rank(caller.identity_id(), caller.class()) else { continue };
        let covers = if in_clear { binding.covers_in_clear(host, port) } else { binding.covers(host, port) };
        if !covers {
            continue;
        }
        let better = best
            .get(binding.header.as_str())
            .is_none_or(|(r, b, _)| (rank, binding.name.as_str()) < (*r, b.name.as_str()));
        if better {
            best.insert(binding.header.as_str(), (rank, binding, value));
        }
    }
    best.into_values()
        .map(|(_, binding, value)| Injection {
            secret: binding.name.to_string(),
            header: binding.header.as_str().to_owned(),
            value: binding.format.render(value),
            methods: binding.methods.clone(),
            paths: binding.paths.clone(),
        })
        .collect()
}
