//! ISO-8601 durations as used by Microsoft's emulator `Config.json` (`PT1M`, `P14D`, `PT0.5S`).

use std::time::Duration;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Parses an ISO-8601 duration: `P[nY][nM][nW][nD][T[nH][nM][n[.f]S]]`.
///
/// Years count as 365 days and months as 30 days (the emulator never needs calendar arithmetic).
/// A fraction is accepted on the smallest unit given (`PT0.5S`, `PT1.5H`). Returns `None` for
/// anything else, including negative durations, an empty `P`/`PT`, and values beyond
/// [`Duration::MAX`]. .NET's `TimeSpan.MaxValue` (`P10675199DT2H48M5.4775807S`) parses.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use sb_emulator::parse_iso8601_duration;
///
/// assert_eq!(parse_iso8601_duration("PT1M"), Some(Duration::from_secs(60)));
/// assert_eq!(parse_iso8601_duration("PT0.5S"), Some(Duration::from_millis(500)));
/// assert_eq!(parse_iso8601_duration("1 minute"), None);
/// ```
pub fn parse_iso8601_duration(text: &str) -> Option<Duration> {
    let rest = text.strip_prefix('P').or_else(|| text.strip_prefix('p'))?;
    let mut in_time = false;
    let mut total: u128 = 0;
    let mut any = false;
    let mut seen_fraction = false;
    let mut last_rank = 0u8;
    let mut chars = rest.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c == 'T' || c == 't' {
            if in_time {
                return None;
            }
            in_time = true;
            chars.next();
            // "PT" must be followed by at least one time component.
            chars.peek()?;
            continue;
        }
        let mut end = start;
        while let Some(&(i, d)) = chars.peek() {
            if d.is_ascii_digit() || d == '.' || d == ',' {
                end = i + d.len_utf8();
                chars.next();
            } else {
                break;
            }
        }
        let number = &rest[start..end];
        let (_, unit) = chars.next()?;
        if number.is_empty() || seen_fraction {
            return None;
        }
        let (unit_nanos, rank): (u128, u8) = match (in_time, unit.to_ascii_uppercase()) {
            (false, 'Y') => (365 * 86_400 * NANOS_PER_SEC, 1),
            (false, 'M') => (30 * 86_400 * NANOS_PER_SEC, 2),
            (false, 'W') => (7 * 86_400 * NANOS_PER_SEC, 3),
            (false, 'D') => (86_400 * NANOS_PER_SEC, 4),
            (true, 'H') => (3_600 * NANOS_PER_SEC, 5),
            (true, 'M') => (60 * NANOS_PER_SEC, 6),
            (true, 'S') => (NANOS_PER_SEC, 7),
            _ => return None,
        };
        if rank <= last_rank {
            return None;
        }
        last_rank = rank;
        let (int_part, frac_part) = match number.find(['.', ',']) {
            Some(i) => (&number[..i], Some(&number[i + 1..])),
            None => (number, None),
        };
        if int_part.is_empty() || !int_part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let whole: u128 = int_part.parse().ok()?;
        total = total.checked_add(whole.checked_mul(unit_nanos)?)?;
        if let Some(frac) = frac_part {
            if frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            seen_fraction = true;
            // Keep 18 digits at most: finer than a nanosecond for every unit up to a year.
            let digits = &frac[..frac.len().min(18)];
            let numerator: u128 = digits.parse().ok()?;
            let denominator = 10u128.checked_pow(u32::try_from(digits.len()).ok()?)?;
            total = total.checked_add(numerator.checked_mul(unit_nanos)? / denominator)?;
        }
        any = true;
    }
    if !any {
        return None;
    }
    let secs = u64::try_from(total / NANOS_PER_SEC).ok()?;
    let nanos = u32::try_from(total % NANOS_PER_SEC).ok()?;
    Some(Duration::new(secs, nanos))
}

/// Formats a duration as ISO-8601 (`PT1M`, `P14D`, `PT0.5S`), the inverse of
/// [`parse_iso8601_duration`] for whole days, hours, minutes and (fractional) seconds.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// assert_eq!(sb_emulator::format_iso8601_duration(Duration::from_secs(90)), "PT1M30S");
/// ```
pub fn format_iso8601_duration(duration: Duration) -> String {
    let mut secs = duration.as_secs();
    let nanos = duration.subsec_nanos();
    let days = secs / 86_400;
    secs %= 86_400;
    let hours = secs / 3_600;
    secs %= 3_600;
    let minutes = secs / 60;
    secs %= 60;
    let mut out = String::from("P");
    if days > 0 {
        out.push_str(&format!("{days}D"));
    }
    if hours > 0 || minutes > 0 || secs > 0 || nanos > 0 || days == 0 {
        out.push('T');
        if hours > 0 {
            out.push_str(&format!("{hours}H"));
        }
        if minutes > 0 {
            out.push_str(&format!("{minutes}M"));
        }
        if secs > 0 || nanos > 0 || (hours == 0 && minutes == 0) {
            if nanos > 0 {
                let frac = format!("{nanos:09}");
                out.push_str(&format!("{secs}.{}S", frac.trim_end_matches('0')));
            } else {
                out.push_str(&format!("{secs}S"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        let cases = [
            ("PT1M", Duration::from_secs(60)),
            ("PT1H", Duration::from_secs(3_600)),
            ("P14D", Duration::from_secs(14 * 86_400)),
            ("PT0.5S", Duration::from_millis(500)),
            ("PT5S", Duration::from_secs(5)),
            ("PT20S", Duration::from_secs(20)),
            ("P1DT2H3M4S", Duration::from_secs(86_400 + 7_200 + 180 + 4)),
            ("P1W", Duration::from_secs(7 * 86_400)),
            ("P1Y", Duration::from_secs(365 * 86_400)),
            ("P1M", Duration::from_secs(30 * 86_400)),
            ("PT1.5M", Duration::from_secs(90)),
            ("PT0,25S", Duration::from_millis(250)),
            ("pt2m", Duration::from_secs(120)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_iso8601_duration(text), Some(expected), "{text}");
        }
    }

    #[test]
    fn parses_timespan_max_value() {
        let max = parse_iso8601_duration("P10675199DT2H48M5.4775807S").unwrap();
        assert_eq!(max.as_secs(), 10_675_199 * 86_400 + 2 * 3_600 + 48 * 60 + 5);
        assert_eq!(max.subsec_nanos(), 477_580_700);
    }

    #[test]
    fn rejects_nonsense() {
        for text in [
            "", "P", "PT", "1 minute", "PT1", "T1M", "P1H", "PT1D", "PT-1S", "PT1M1H", "PT1.S",
            "PT.5S", "PT1.5M2S", "P1DT", "PT1S1S", "00:01:00", "PT1MT1S", "P 1D",
        ] {
            assert_eq!(parse_iso8601_duration(text), None, "{text:?}");
        }
    }

    #[test]
    fn formats_round_trip() {
        for text in ["PT1M", "P14D", "PT0.5S", "P1DT2H3M4S", "PT0S", "PT1H"] {
            let d = parse_iso8601_duration(text).unwrap();
            assert_eq!(format_iso8601_duration(d), text);
        }
    }
}
