//! Whether a principal may call a model right now, and if not, when it may again. Pure
//! functions of a grant, its provider, the counters and the time.

use chrono::{Datelike, Days, NaiveDate, TimeZone, Timelike, Utc};
use chrono_tz::Tz;

use crate::outcome::Outcome;
use crate::shm::{utc_day, utc_hour, CounterRead};
use crate::snapshot::{Grant, Provider, Window};

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 86_400_000;
const MINUTES_PER_DAY: u16 = 1440;

/// A model's availability for one principal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Available,
    RateLimited,
    OutsideHours,
    BudgetExceeded,
}

impl Status {
    /// The wire name (`available`, `rate_limited`, `outside_hours`, `budget_exceeded`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Available => "available",
            Status::RateLimited => "rate_limited",
            Status::OutsideHours => "outside_hours",
            Status::BudgetExceeded => "budget_exceeded",
        }
    }
}

/// The counters a status depends on, read from the shared segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub calls_this_hour: i64,
    pub provider_calls_this_hour: i64,
    pub spent_today_nano: i64,
}

/// A grant's [`Counters`] at `now_ms`: its calls this hour, its provider's, its spend today.
pub(crate) fn counters(grant: &Grant, provider: &Provider, segment: &impl CounterRead, now_ms: i64) -> Counters {
    let (day, hour) = (utc_day(now_ms), utc_hour(now_ms));
    Counters {
        calls_this_hour: segment.counter(grant.calls_key.at(hour)),
        provider_calls_this_hour: segment.counter(provider.calls_key.at(hour)),
        spent_today_nano: segment.counter(grant.spend_key.at(day)),
    }
}

/// Start of the next UTC hour after `now_ms`.
#[must_use]
pub fn next_utc_hour(now_ms: i64) -> i64 {
    (now_ms.div_euclid(HOUR_MS) + 1) * HOUR_MS
}

/// Next UTC midnight after `now_ms`.
#[must_use]
pub fn next_utc_midnight(now_ms: i64) -> i64 {
    (now_ms.div_euclid(DAY_MS) + 1) * DAY_MS
}

/// Why policy refuses a call (mesh-behaviour §5.2 step 6, kill switch aside).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denial {
    /// `provider_hourly_limit_reached`.
    ProviderHourly,
    /// `user_model_hourly_limit_reached`, with the grant's limit.
    UserHourly { limit: i64 },
    /// `outside_allowed_hours`.
    OutsideHours,
    /// `budget_exceeded`, with the daily cap in nano-USD.
    Budget { cap_nano: i64 },
}

impl Denial {
    /// The outcome it answers with (its code and status: [`Outcome`]'s table).
    #[must_use]
    pub fn outcome(self) -> Outcome {
        match self {
            Denial::ProviderHourly => Outcome::ProviderHourlyLimitReached,
            Denial::UserHourly { .. } => Outcome::UserModelHourlyLimitReached,
            Denial::OutsideHours => Outcome::OutsideAllowedHours,
            Denial::Budget { .. } => Outcome::BudgetExceeded,
        }
    }
}

/// The first policy denial in Mesh's order and when it may lift: provider hourly calls, then
/// the principal's hourly calls on the model, then the allowed days and hours, then the daily
/// budget. `None` when the call is allowed.
#[must_use]
pub fn denial(grant: &Grant, provider: &Provider, counters: &Counters, now_ms: i64) -> Option<(Denial, Option<i64>)> {
    if provider
        .max_calls_per_hour
        .is_some_and(|max| counters.provider_calls_this_hour >= max)
    {
        return Some((Denial::ProviderHourly, Some(next_utc_hour(now_ms))));
    }
    if let Some(limit) = grant.max_calls_per_hour.filter(|&max| counters.calls_this_hour >= max) {
        return Some((Denial::UserHourly { limit }, Some(next_utc_hour(now_ms))));
    }
    if !grant.always_open && !is_open(grant, now_ms) {
        return Some((Denial::OutsideHours, next_open(grant, now_ms)));
    }
    if grant.daily_cap_nano_usd > 0 && counters.spent_today_nano >= grant.daily_cap_nano_usd {
        return Some((
            Denial::Budget {
                cap_nano: grant.daily_cap_nano_usd,
            },
            Some(next_utc_midnight(now_ms)),
        ));
    }
    None
}

/// The status and, unless available, when it may change (see [`denial`] for the order).
#[must_use]
pub fn status(grant: &Grant, provider: &Provider, counters: &Counters, now_ms: i64) -> (Status, Option<i64>) {
    match denial(grant, provider, counters, now_ms) {
        None => (Status::Available, None),
        Some((Denial::ProviderHourly | Denial::UserHourly { .. }, at)) => (Status::RateLimited, at),
        Some((Denial::OutsideHours, at)) => (Status::OutsideHours, at),
        Some((Denial::Budget { .. }, at)) => (Status::BudgetExceeded, at),
    }
}

/// Open minute ranges `[start, end)` of one local day. No window (or `from == to`) is the whole
/// day; an overnight window (`from > to`) is open from `from` to midnight and from midnight to `to`.
fn intervals(window: Option<Window>) -> impl Iterator<Item = (u16, u16)> {
    let ranges = match window {
        Some(Window { from_min, to_min }) if from_min < to_min => [(from_min, to_min), (0, 0)],
        Some(Window { from_min, to_min }) if from_min > to_min => [(0, to_min), (from_min, MINUTES_PER_DAY)],
        _ => [(0, MINUTES_PER_DAY), (0, 0)],
    };
    ranges.into_iter().filter(|(start, end)| start < end)
}

fn day_allowed(grant: &Grant, date: NaiveDate) -> bool {
    grant.active_days & (1 << date.weekday().num_days_from_sunday()) != 0
}

/// Whether the grant's days and hours allow a call at `now_ms` (the grant's timezone; the
/// day checked is the local day of `now_ms`, also during the after-midnight part of an
/// overnight window).
#[must_use]
pub fn is_open(grant: &Grant, now_ms: i64) -> bool {
    let Some(local) = Utc
        .timestamp_millis_opt(now_ms)
        .single()
        .map(|t| t.with_timezone(&grant.timezone))
    else {
        return false;
    };
    let minute = (local.hour() * 60 + local.minute()) as u16;
    day_allowed(grant, local.date_naive())
        && intervals(grant.window).any(|(start, end)| start <= minute && minute < end)
}

/// The UTC instant of local `minute` on `date`; a time skipped by a DST change opens when the
/// gap ends, a repeated one at its first occurrence.
fn local_instant(tz: &Tz, date: NaiveDate, minute: u16) -> Option<i64> {
    let midnight = date.and_hms_opt(0, 0, 0)?;
    (0..24 * 60).find_map(|skip| {
        let wall = midnight + chrono::Duration::minutes(i64::from(minute) + skip);
        tz.from_local_datetime(&wall).earliest().map(|t| t.timestamp_millis())
    })
}

/// The first instant at or after `now_ms` when the grant's days and hours allow a call.
#[must_use]
pub fn next_open(grant: &Grant, now_ms: i64) -> Option<i64> {
    if is_open(grant, now_ms) {
        return Some(now_ms);
    }
    let today = Utc
        .timestamp_millis_opt(now_ms)
        .single()?
        .with_timezone(&grant.timezone)
        .date_naive();
    (0..=8u64)
        .filter_map(|offset| today.checked_add_days(Days::new(offset)))
        .filter(|&date| day_allowed(grant, date))
        .flat_map(|date| {
            intervals(grant.window).filter_map(move |(start, _)| local_instant(&grant.timezone, date, start))
        })
        // A window lying wholly inside a DST gap never opens that day.
        .filter(|&instant| instant > now_ms && is_open(grant, instant))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::test_support::{grant, provider};
    use chrono::DateTime;

    fn ms(rfc3339: &str) -> i64 {
        DateTime::parse_from_rfc3339(rfc3339).unwrap().timestamp_millis()
    }

    fn at(ms: i64) -> String {
        DateTime::from_timestamp_millis(ms).unwrap().to_rfc3339()
    }

    #[test]
    fn test_order_provider_rate_then_user_rate_then_hours_then_budget() {
        let mut g = grant();
        g.max_calls_per_hour = Some(5);
        g.daily_cap_nano_usd = 100;
        g.window = Some(Window {
            from_min: 9 * 60,
            to_min: 17 * 60,
        });
        let mut p = provider();
        p.max_calls_per_hour = Some(10);
        let night = ms("2025-03-05T22:00:00Z");
        let all = Counters {
            calls_this_hour: 5,
            provider_calls_this_hour: 10,
            spent_today_nano: 100,
        };
        assert_eq!(
            status(&g, &p, &all, night),
            (Status::RateLimited, Some(ms("2025-03-05T23:00:00Z")))
        );
        let c = Counters {
            provider_calls_this_hour: 9,
            ..all
        };
        assert_eq!(status(&g, &p, &c, night).0, Status::RateLimited);
        let c = Counters {
            calls_this_hour: 4,
            ..c
        };
        assert_eq!(
            status(&g, &p, &c, night),
            (Status::OutsideHours, Some(ms("2025-03-06T09:00:00Z")))
        );
        let noon = ms("2025-03-05T12:00:00Z");
        assert_eq!(
            status(&g, &p, &c, noon),
            (Status::BudgetExceeded, Some(ms("2025-03-06T00:00:00Z")))
        );
        let c = Counters {
            spent_today_nano: 99,
            ..c
        };
        assert_eq!(status(&g, &p, &c, noon), (Status::Available, None));
        g.daily_cap_nano_usd = 0;
        assert_eq!(
            status(
                &g,
                &p,
                &Counters {
                    spent_today_nano: i64::MAX,
                    ..c
                },
                noon
            )
            .0,
            Status::Available
        );
    }

    #[test]
    fn test_overnight_window_is_open_late_and_early() {
        let mut g = grant();
        g.window = Some(Window {
            from_min: 22 * 60,
            to_min: 6 * 60,
        });
        assert!(is_open(&g, ms("2025-03-05T23:30:00Z")));
        assert!(is_open(&g, ms("2025-03-05T05:59:00Z")));
        assert!(!is_open(&g, ms("2025-03-05T06:00:00Z")));
        assert!(!is_open(&g, ms("2025-03-05T12:00:00Z")));
        assert_eq!(
            at(next_open(&g, ms("2025-03-05T12:00:00Z")).unwrap()),
            "2025-03-05T22:00:00+00:00"
        );
    }

    #[test]
    fn test_always_open_ignores_window_and_days() {
        let mut g = grant();
        g.window = Some(Window {
            from_min: 60,
            to_min: 120,
        });
        g.active_days = 0;
        g.always_open = true;
        assert_eq!(
            status(&g, &provider(), &Counters::default(), 0),
            (Status::Available, None)
        );
    }

    #[test]
    fn test_next_allowed_day_starts_at_its_window_or_local_midnight() {
        let mut g = grant();
        g.timezone = chrono_tz::Europe::Paris;
        g.active_days = 1 << 1; // Mondays only
                                // Wednesday 2025-03-05 12:00 Paris (11:00Z): next Monday 2025-03-10 at local midnight.
        assert_eq!(
            at(next_open(&g, ms("2025-03-05T11:00:00Z")).unwrap()),
            "2025-03-09T23:00:00+00:00"
        );
        g.window = Some(Window {
            from_min: 9 * 60,
            to_min: 17 * 60,
        });
        assert_eq!(
            at(next_open(&g, ms("2025-03-05T11:00:00Z")).unwrap()),
            "2025-03-10T08:00:00+00:00"
        );
        // Monday 18:00 Paris: window over, next Monday.
        assert_eq!(
            at(next_open(&g, ms("2025-03-10T17:00:00Z")).unwrap()),
            "2025-03-17T08:00:00+00:00"
        );
    }

    #[test]
    fn test_window_start_in_dst_gap_opens_when_gap_ends() {
        let mut g = grant();
        g.timezone = chrono_tz::America::New_York;
        g.window = Some(Window {
            from_min: 2 * 60 + 30,
            to_min: 5 * 60,
        });
        // 2025-03-09 02:30 does not exist in New York; clocks jump 02:00 -> 03:00 EDT (07:00Z).
        assert_eq!(
            at(next_open(&g, ms("2025-03-09T05:00:00Z")).unwrap()),
            "2025-03-09T07:00:00+00:00"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// next_open equals a minute-by-minute scan of is_open (the slow, obvious reference).
        #[test]
        fn prop_next_open_matches_minute_scan(
            from in 0u16..=1440, to in 0u16..=1440, windowed: bool, days in 1u8..0x80,
            zone in 0usize..3, now in 1_735_689_600_000i64..1_767_225_600_000,
        ) {
            let mut g = grant();
            g.window = windowed.then_some(Window { from_min: from, to_min: to });
            g.active_days = days;
            g.timezone = [chrono_tz::UTC, chrono_tz::Europe::Paris, chrono_tz::America::New_York][zone];
            let reference = if is_open(&g, now) {
                Some(now)
            } else {
                let first = (now / 60_000 + 1) * 60_000;
                (0..9 * 1440).map(|m| first + m * 60_000).find(|&t| is_open(&g, t))
            };
            proptest::prop_assert_eq!(next_open(&g, now), reference);
        }
    }

    #[test]
    fn test_window_wholly_inside_dst_gap_is_skipped_that_day() {
        let mut g = grant();
        g.timezone = chrono_tz::America::New_York;
        g.window = Some(Window {
            from_min: 2 * 60 + 10,
            to_min: 2 * 60 + 50,
        });
        // 2025-03-09 has no 02:10-02:50 in New York; the next opening is 2025-03-10 02:10 EDT.
        assert_eq!(
            at(next_open(&g, ms("2025-03-09T05:00:00Z")).unwrap()),
            "2025-03-10T06:10:00+00:00"
        );
    }

    #[test]
    fn test_timezone_decides_the_day() {
        let mut g = grant();
        g.timezone = chrono_tz::Asia::Tokyo;
        g.active_days = 1 << 4; // Thursdays
                                // Wednesday 2025-03-05 20:00Z is Thursday 05:00 in Tokyo.
        assert!(is_open(&g, ms("2025-03-05T20:00:00Z")));
        assert!(!is_open(&g, ms("2025-03-05T10:00:00Z")));
    }
}
