//! Instants as milliseconds since the Unix epoch, with an RFC 3339 rendering.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An instant, in milliseconds since 1970-01-01T00:00:00Z (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The instant `millis` milliseconds after the epoch.
    pub const fn from_unix_millis(millis: i64) -> Self {
        Self(millis)
    }

    /// The instant `secs` seconds after the epoch.
    pub const fn from_unix_secs(secs: i64) -> Self {
        Self(secs.saturating_mul(1000))
    }

    /// Milliseconds since the epoch.
    pub const fn unix_millis(self) -> i64 {
        self.0
    }

    /// Whole seconds since the epoch (rounded down).
    pub const fn unix_secs(self) -> i64 {
        self.0.div_euclid(1000)
    }

    /// This instant moved by `millis` (saturating).
    #[must_use]
    pub const fn plus_millis(self, millis: i64) -> Self {
        Self(self.0.saturating_add(millis))
    }

    /// This instant moved by `secs` seconds (saturating).
    #[must_use]
    pub const fn plus_secs(self, secs: i64) -> Self {
        Self(self.0.saturating_add(secs.saturating_mul(1000)))
    }

    /// RFC 3339 in UTC with millisecond precision, e.g. `2026-12-02T10:18:03.000Z`.
    pub fn to_rfc3339(self) -> String {
        let secs = self.0.div_euclid(1000);
        let millis = self.0.rem_euclid(1000);
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
            rem / 3600,
            (rem % 3600) / 60,
            rem % 60
        )
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 to (year, month, day).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_rfc3339() {
        assert_eq!(Timestamp::from_unix_millis(0).to_rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(Timestamp::from_unix_millis(1_796_207_883_042).to_rfc3339(), "2026-12-02T10:38:03.042Z");
        assert_eq!(Timestamp::from_unix_millis(951_782_400_000).to_rfc3339(), "2000-02-29T00:00:00.000Z");
    }
}
