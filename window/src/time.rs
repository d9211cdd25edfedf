//! The one date helper: Unix milliseconds as UTC calendar dates (proleptic
//! Gregorian), for transcripts, exports, `status`, session ids. Pure: the
//! clock is read by `oceancode_ledger::time::now_ms`.

/// A UTC date and time of day.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Utc {
    /// Year.
    pub year: i64,
    /// Month, 1–12.
    pub month: u32,
    /// Day of the month, 1–31.
    pub day: u32,
    /// Hour, 0–23.
    pub hour: u32,
    /// Minute, 0–59.
    pub minute: u32,
    /// Second, 0–59.
    pub second: u32,
}

impl Utc {
    /// The UTC date and time of Unix milliseconds `ms` (before 1970 too).
    pub fn from_ms(ms: i64) -> Utc {
        let secs = ms.div_euclid(1000);
        let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
        let rem = secs.rem_euclid(86_400) as u32;
        Utc {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
        }
    }
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
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

/// `2026-12-01T00:58:07Z` for Unix milliseconds.
pub fn utc_iso(ms: i64) -> String {
    let t = Utc::from_ms(ms);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

/// `20261201-005807` for Unix milliseconds: the date part of a session id.
pub fn id_stamp(ms: i64) -> String {
    let t = Utc::from_ms(ms);
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn formats() {
        assert_eq!(utc_iso(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_iso(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc_iso(-1), "1969-12-31T23:59:59Z");
        let ms = 1_796_086_687_000; // 2026-12-01T00:58:07Z
        assert_eq!(utc_iso(ms), "2026-12-01T00:58:07Z");
        assert_eq!(id_stamp(ms), "20261201-005807");
    }

    #[test]
    fn every_day_of_four_centuries_follows_the_previous() {
        // The proleptic Gregorian calendar, day by day from 1900 to 2300.
        let mut prev = civil_from_days(-25_567); // 1900-01-01
        assert_eq!(prev, (1900, 1, 1));
        for z in -25_566..120_000 {
            let d = civil_from_days(z);
            let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let len = match prev.1 {
                2 if leap(prev.0) => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            let want = if prev.2 < len {
                (prev.0, prev.1, prev.2 + 1)
            } else if prev.1 < 12 {
                (prev.0, prev.1 + 1, 1)
            } else {
                (prev.0 + 1, 1, 1)
            };
            assert_eq!(d, want, "day {z}");
            prev = d;
        }
    }
}
