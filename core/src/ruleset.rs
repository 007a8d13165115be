//! Spend rules as the snapshot holds them (API.md "Organisation and spend rules"): the config's
//! rules compiled into [`Rules`] (entries with their populations, scopes, windows and actions, in
//! precedence order, and per model the entries whose scope covers it) and the rules' calendar
//! ([`CalendarWindow`]). Deciding on them at request time is [`crate::rules`].

use chrono::{Datelike, Days, LocalResult, Months, NaiveDate, TimeZone};
use chrono_tz::Tz;
use serde::Deserialize;

use crate::shm;

#[derive(Deserialize)]
pub(crate) struct RawRule {
    id: String,
    weight: i64,
    mode: String,
    #[serde(default)]
    entries: Vec<RawEntry>,
    #[serde(default)]
    entry_numbers: Vec<i64>,
}

#[derive(Deserialize)]
pub(crate) struct RawEntry {
    window: String,
    #[serde(default)]
    actions: Vec<RawAction>,
    #[serde(default)]
    tiers: Vec<String>,
    #[serde(default)]
    leaders: Vec<i64>,
    #[serde(default)]
    business_units: Vec<String>,
    #[serde(default)]
    exempt: Vec<i64>,
    /// Applications (principal indexes) the entry holds to; empty: no restriction.
    #[serde(default)]
    applications: Vec<i64>,
    /// Principals (indexes) the entry holds to, e.g. a pilot's members; empty: no restriction.
    #[serde(default)]
    principals: Vec<i64>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    model: Option<i64>,
    /// Several models (indexes) as one scope, e.g. a pilot's models.
    #[serde(default)]
    models: Vec<i64>,
    #[serde(default)]
    threshold_nano: Option<i64>,
    #[serde(default)]
    calls_per_minute: Option<i64>,
    #[serde(default)]
    tokens_per_minute: Option<i64>,
}

#[derive(Deserialize)]
pub(crate) struct RawAction {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    hours: i64,
    #[serde(default)]
    text: String,
    #[serde(default)]
    channels: Vec<String>,
    #[serde(default)]
    template: Option<String>,
}

pub(crate) fn people(errors: &mut Vec<String>, what: &str, list: &[i64], count: usize) -> Vec<u32> {
    list.iter()
        .filter_map(|&i| {
            if i < 0 || i as usize >= count {
                errors.push(format!("{what}: index {i} out of range (0..{count})"));
                None
            } else {
                Some(i as u32)
            }
        })
        .collect()
}

/// A rule window, in the rules' calendar zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CalendarWindow {
    Daily,
    Weekly,
    Monthly,
}

pub(crate) const EPOCH: NaiveDate = NaiveDate::from_ymd_opt(1970, 1, 1).expect("a valid date");

impl CalendarWindow {
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "daily" => Self::Daily,
            "weekly" => Self::Weekly,
            "monthly" => Self::Monthly,
            _ => return None,
        })
    }

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Daily => "daily",
            Self::Weekly => "weekly",
            Self::Monthly => "monthly",
        }
    }

    /// The counter kind of the committed spend in this window.
    #[must_use]
    pub fn kind(self) -> u8 {
        match self {
            Self::Daily => shm::WINDOW_DAY,
            Self::Weekly => shm::WINDOW_WEEK,
            Self::Monthly => shm::WINDOW_MONTH,
        }
    }

    /// The window instance holding local date `date`: days since 1970-01-01; weeks (Monday to
    /// Sunday) since the week of 1969-12-29; months since January 1970.
    #[must_use]
    pub fn period_of(self, date: NaiveDate) -> u32 {
        let day = (date - EPOCH).num_days();
        let period = match self {
            Self::Daily => day,
            // 1970-01-01 was a Thursday: day + 3 counts from Monday 1969-12-29.
            Self::Weekly => (day + 3).div_euclid(7),
            Self::Monthly => i64::from(date.year() - 1970) * 12 + i64::from(date.month0()),
        };
        period.clamp(0, i64::from(u32::MAX)) as u32
    }

    /// The instance holding the instant `unix_ms` in `tz`.
    #[must_use]
    pub fn period(self, tz: Tz, unix_ms: i64) -> u32 {
        self.period_of(local_date(tz, unix_ms))
    }

    /// The first local date of instance `period`.
    #[must_use]
    pub fn first_date(self, period: u32) -> NaiveDate {
        let period = i64::from(period);
        match self {
            Self::Daily => EPOCH + chrono::Duration::days(period),
            Self::Weekly => EPOCH + chrono::Duration::days(period * 7 - 3),
            Self::Monthly => EPOCH.checked_add_months(Months::new(period as u32)).unwrap_or(EPOCH),
        }
    }

    /// `[start, end)` of instance `period` as unix ms: local midnights in `tz` (the first instant
    /// of the day where DST skips midnight).
    #[must_use]
    pub fn bounds(self, tz: Tz, period: u32) -> (i64, i64) {
        let start = self.first_date(period);
        let end = match self {
            Self::Daily => start.checked_add_days(Days::new(1)),
            Self::Weekly => start.checked_add_days(Days::new(7)),
            Self::Monthly => start.checked_add_months(Months::new(1)),
        }
        .unwrap_or(start);
        (local_midnight(tz, start), local_midnight(tz, end))
    }
}

/// The local date of `unix_ms` in `tz`.
#[must_use]
pub fn local_date(tz: Tz, unix_ms: i64) -> NaiveDate {
    tz.timestamp_millis_opt(unix_ms)
        .single()
        .map_or(EPOCH, |t| t.date_naive())
}

/// The first instant of local date `date` in `tz` (unix ms).
#[must_use]
pub fn local_midnight(tz: Tz, date: NaiveDate) -> i64 {
    let mut wall = date.and_hms_opt(0, 0, 0).expect("midnight exists");
    // A DST gap can swallow midnight (e.g. America/Santiago): the day starts at the gap's end.
    for _ in 0..4 * 24 {
        match tz.from_local_datetime(&wall) {
            LocalResult::Single(t) => return t.timestamp_millis(),
            LocalResult::Ambiguous(earliest, _) => return earliest.timestamp_millis(),
            LocalResult::None => wall += chrono::Duration::minutes(15),
        }
    }
    (date - EPOCH).num_days() * 86_400_000
}

/// What a rule entry governs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    Tag(String),
    Model(u32),
    /// Several models counted together (a pilot's models): spend on any of them counts.
    Models(Vec<u32>),
}

/// A notification channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    Webhook,
    Email,
}

impl Channel {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Webhook => "webhook",
            Self::Email => "email",
        }
    }
}

/// How a rule applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Enforce,
    Shadow,
    /// Follows the global switch ([`Rules::enforce`]).
    Inherit,
}

/// One entry of a rule.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Its position in the rule as authored.
    pub number: u32,
    pub tiers: Vec<String>,
    pub leaders: Vec<u32>,
    pub business_units: Vec<String>,
    pub exempt: Vec<u32>,
    /// Applications the population is held to (principal indexes); empty: no restriction.
    pub applications: Vec<u32>,
    /// Principals the population is held to (a pilot's members); empty: no restriction.
    pub principals: Vec<u32>,
    pub scope: Scope,
    /// Bit `m` set when the scope covers model `m`.
    covers: Vec<u64>,
    pub window: CalendarWindow,
    pub threshold_nano: Option<i64>,
    pub calls_per_minute: Option<i64>,
    pub tokens_per_minute: Option<i64>,
    pub block: bool,
    pub pause_hours: Option<i64>,
    pub warn: Option<String>,
    pub notify: Vec<Channel>,
    pub template: Option<String>,
    /// The entry's id in counter keys: xxh3 of `rule id ‖ '#' ‖ number`.
    pub key_id: [u8; 16],
    /// Its scope and window's id in the pool's key: every entry over the same scope and window
    /// shares one pool per person (the same calls reserve in it), so a call takes one lease per
    /// distinct scope and window, however many entries cover it.
    pub pool_id: [u8; 16],
}

impl Entry {
    /// Whether the scope covers model `model`.
    #[must_use]
    pub fn covers(&self, model: u32) -> bool {
        self.covers
            .get(model as usize / 64)
            .is_some_and(|word| word >> (model % 64) & 1 == 1)
    }

    /// The strongest action the entry takes at or over its threshold (`block` > `pause` > `warn`
    /// > `notify`).
    #[must_use]
    pub fn strongest_action(&self) -> Option<&'static str> {
        if self.block {
            Some("block")
        } else if self.pause_hours.is_some() {
            Some("pause")
        } else if self.warn.is_some() {
            Some("warn")
        } else if !self.notify.is_empty() {
            Some("notify")
        } else {
            None
        }
    }
}

/// A rule.
#[derive(Clone, Debug)]
pub struct Rule {
    pub id: String,
    pub weight: i64,
    pub mode: Mode,
    pub entries: Vec<Entry>,
}

/// Every rule of a snapshot, in precedence order, with the calendar and the global switch.
#[derive(Clone, Debug)]
pub struct Rules {
    pub rules: Vec<Rule>,
    pub tz: Tz,
    /// The global switch: `inherit` rules enforce when true.
    pub enforce: bool,
    /// Per model, the `(rule, entry)` indexes whose scope covers it, in precedence order.
    by_model: Vec<Vec<(u32, u32)>>,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            tz: Tz::UTC,
            enforce: true,
            by_model: Vec::new(),
        }
    }
}

fn build_entry(
    errors: &mut Vec<String>,
    what: &str,
    rule_id: &str,
    number: u32,
    raw: RawEntry,
    principals: usize,
    model_tags: &[&[String]],
) -> Entry {
    let window = CalendarWindow::parse(&raw.window).unwrap_or_else(|| {
        errors.push(format!(
            "{what}: window {:?} is not daily, weekly or monthly",
            raw.window
        ));
        CalendarWindow::Daily
    });
    let in_range = |m: i64| m >= 0 && (m as usize) < model_tags.len();
    let scope = match (raw.tag, raw.model, raw.models.is_empty()) {
        (Some(tag), None, true) if !tag.is_empty() => Scope::Tag(tag),
        (None, Some(m), true) if in_range(m) => Scope::Model(m as u32),
        (None, None, false) if raw.models.iter().all(|&m| in_range(m)) => {
            let mut list: Vec<u32> = raw.models.iter().map(|&m| m as u32).collect();
            list.sort_unstable();
            list.dedup();
            Scope::Models(list)
        }
        _ => {
            errors.push(format!(
                "{what}: the scope is one tag, one model or a list of models (indexes in range)"
            ));
            Scope::Tag(String::new())
        }
    };
    let mut covers = vec![0u64; model_tags.len().div_ceil(64)];
    for (i, tags) in model_tags.iter().enumerate() {
        let covered = match &scope {
            Scope::Tag(tag) => tags.iter().any(|t| t == tag),
            Scope::Model(m) => *m as usize == i,
            Scope::Models(list) => list.contains(&(i as u32)),
        };
        if covered {
            covers[i / 64] |= 1 << (i % 64);
        }
    }
    let positive = |errors: &mut Vec<String>, name: &str, value: Option<i64>| {
        if value.is_some_and(|v| v <= 0) {
            errors.push(format!("{what}: {name} must be positive"));
        }
        value.filter(|&v| v > 0)
    };
    let threshold_nano = positive(errors, "threshold_nano", raw.threshold_nano);
    let calls_per_minute = positive(errors, "calls_per_minute", raw.calls_per_minute);
    let tokens_per_minute = positive(errors, "tokens_per_minute", raw.tokens_per_minute);
    if threshold_nano.is_none() && calls_per_minute.is_none() && tokens_per_minute.is_none() {
        errors.push(format!("{what}: needs a threshold or a per-minute cap"));
    }
    let scope_for_pool = scope.clone();
    let mut entry = Entry {
        number,
        tiers: raw.tiers,
        leaders: people(errors, &format!("{what}.leaders"), &raw.leaders, principals),
        business_units: raw.business_units,
        exempt: people(errors, &format!("{what}.exempt"), &raw.exempt, principals),
        applications: people(errors, &format!("{what}.applications"), &raw.applications, principals),
        principals: people(errors, &format!("{what}.principals"), &raw.principals, principals),
        scope,
        covers,
        window,
        threshold_nano,
        calls_per_minute,
        tokens_per_minute,
        block: false,
        pause_hours: None,
        warn: None,
        notify: Vec::new(),
        template: None,
        key_id: xxhash_rust::xxh3::xxh3_128(format!("{rule_id}#{number}").as_bytes()).to_be_bytes(),
        pool_id: xxhash_rust::xxh3::xxh3_128(
            match &scope_for_pool {
                Scope::Tag(tag) => format!("tag:{tag}|{}", window.as_str()),
                Scope::Model(m) => format!("model:{m}|{}", window.as_str()),
                Scope::Models(list) => format!("models:{list:?}|{}", window.as_str()),
            }
            .as_bytes(),
        )
        .to_be_bytes(),
    };
    for action in raw.actions {
        match action.kind.as_str() {
            "block" => entry.block = true,
            "pause" if (1..=8760).contains(&action.hours) => entry.pause_hours = Some(action.hours),
            "warn" if !action.text.is_empty() => entry.warn = Some(action.text),
            "notify" => {
                for channel in &action.channels {
                    match channel.as_str() {
                        "webhook" => entry.notify.push(Channel::Webhook),
                        "email" => entry.notify.push(Channel::Email),
                        other => errors.push(format!("{what}: channel {other:?} is not webhook or email")),
                    }
                }
                entry.template = action.template;
            }
            other => errors.push(format!("{what}: action {other:?} is not valid")),
        }
    }
    if entry.threshold_nano.is_none()
        && (entry.pause_hours.is_some() || entry.warn.is_some() || !entry.notify.is_empty())
    {
        errors.push(format!("{what}: pause, warn and notify need a threshold"));
    }
    entry
}

impl Rules {
    /// The rules of `raw` over `principals` people and models with tags `model_tags` (by index).
    pub(crate) fn build(
        errors: &mut Vec<String>,
        raw: Vec<RawRule>,
        enforce: bool,
        calendar_tz: &str,
        principals: usize,
        model_tags: &[&[String]],
    ) -> Self {
        let tz = calendar_tz.parse().unwrap_or_else(|_| {
            errors.push(format!("calendar_tz {calendar_tz:?} is not an IANA zone"));
            Tz::UTC
        });
        let mut seen = std::collections::HashSet::new();
        let mut rules: Vec<Rule> = raw
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let what = format!("rules[{i}] ({:?})", r.id);
                if !seen.insert(r.id.clone()) {
                    errors.push(format!("{what}: duplicate id"));
                }
                let mode = match r.mode.as_str() {
                    "enforce" => Mode::Enforce,
                    "shadow" => Mode::Shadow,
                    "inherit" => Mode::Inherit,
                    other => {
                        errors.push(format!("{what}: mode {other:?} is not enforce, shadow or inherit"));
                        Mode::Shadow
                    }
                };
                let entries = r
                    .entries
                    .into_iter()
                    .enumerate()
                    .map(|(j, e)| {
                        let number = r.entry_numbers.get(j).copied().unwrap_or(j as i64).max(0) as u32;
                        build_entry(
                            errors,
                            &format!("{what}.entries[{j}]"),
                            &r.id,
                            number,
                            e,
                            principals,
                            model_tags,
                        )
                    })
                    .collect();
                Rule {
                    id: r.id,
                    weight: r.weight,
                    mode,
                    entries,
                }
            })
            .collect();
        rules.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.id.cmp(&b.id)));
        let mut by_model = vec![Vec::new(); model_tags.len()];
        for (r, rule) in rules.iter().enumerate() {
            for (e, entry) in rule.entries.iter().enumerate() {
                for (m, list) in by_model.iter_mut().enumerate() {
                    if entry.covers(m as u32) {
                        list.push((r as u32, e as u32));
                    }
                }
            }
        }
        Self {
            rules,
            tz,
            enforce,
            by_model,
        }
    }

    /// Whether `rule` refuses calls (rather than only recording what it would do).
    #[must_use]
    pub fn enforcing(&self, rule: &Rule) -> bool {
        match rule.mode {
            Mode::Enforce => true,
            Mode::Shadow => false,
            Mode::Inherit => self.enforce,
        }
    }

    /// The entries covering `model`, in precedence order.
    pub fn covering(&self, model: u32) -> impl Iterator<Item = (&Rule, &Entry)> + '_ {
        self.by_model.get(model as usize).into_iter().flatten().map(|&(r, e)| {
            let rule = &self.rules[r as usize];
            (rule, &rule.entries[e as usize])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(tz: Tz, y: i32, m: u32, d: u32, h: u32) -> i64 {
        tz.with_ymd_and_hms(y, m, d, h, 0, 0)
            .earliest()
            .unwrap()
            .timestamp_millis()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Window arithmetic against its definition, in zones with DST (both hemispheres), a
        /// half-hour offset and a skipped midnight: the instance holding an instant contains it,
        /// instances abut, each starts at a local midnight on its first date (a Monday for weeks,
        /// the 1st for months), and a day is 23 to 25 hours long.
        #[test]
        fn windows_hold_their_instants_and_abut(
            unix_s in 0i64..4_102_444_800,
            zone in prop_oneof![Just("UTC"), Just("Europe/Paris"), Just("America/New_York"),
                                Just("Australia/Sydney"), Just("Asia/Kolkata"), Just("America/Santiago"),
                                Just("Pacific/Chatham")],
            window in prop_oneof![Just(CalendarWindow::Daily), Just(CalendarWindow::Weekly),
                                  Just(CalendarWindow::Monthly)],
        ) {
            let tz: Tz = zone.parse().unwrap();
            let t = unix_s * 1000;
            let period = window.period(tz, t);
            let (start, end) = window.bounds(tz, period);
            prop_assert!(start <= t && t < end, "{zone} {window:?} {t}: [{start}, {end})");
            prop_assert_eq!(window.bounds(tz, period + 1).0, end);
            let first = window.first_date(period);
            prop_assert_eq!(local_date(tz, start), first);
            prop_assert_eq!(window.period_of(first), period);
            match window {
                CalendarWindow::Daily => prop_assert!((23 * 3_600_000..=25 * 3_600_000).contains(&(end - start))),
                CalendarWindow::Weekly => prop_assert_eq!(first.weekday(), chrono::Weekday::Mon),
                CalendarWindow::Monthly => prop_assert_eq!(first.day(), 1),
            }
        }
    }

    #[test]
    fn windows_follow_the_calendar_zone() {
        let paris: Tz = "Europe/Paris".parse().unwrap();
        // 23:30 UTC on Sunday 2026-03-29 is already Monday in Paris (DST began that night).
        let t = ms(Tz::UTC, 2026, 3, 29, 23) + 30 * 60_000;
        assert_eq!(local_date(paris, t), NaiveDate::from_ymd_opt(2026, 3, 30).unwrap());
        let week = CalendarWindow::Weekly.period(paris, t);
        let (start, end) = CalendarWindow::Weekly.bounds(paris, week);
        assert_eq!(start, ms(paris, 2026, 3, 30, 0));
        assert_eq!(end, ms(paris, 2026, 4, 6, 0));
        let (start, end) = CalendarWindow::Daily.bounds(paris, CalendarWindow::Daily.period(paris, t));
        assert_eq!(end - start, 24 * 3_600_000);
        // The DST day itself is 23 hours long.
        let dst_day = CalendarWindow::Daily.period_of(NaiveDate::from_ymd_opt(2026, 3, 29).unwrap());
        let (start, end) = CalendarWindow::Daily.bounds(paris, dst_day);
        assert_eq!(end - start, 23 * 3_600_000);
        // Leap February.
        let feb = CalendarWindow::Monthly.period_of(NaiveDate::from_ymd_opt(2028, 2, 10).unwrap());
        let (start, end) = CalendarWindow::Monthly.bounds(Tz::UTC, feb);
        assert_eq!(end - start, 29 * 86_400_000);
        assert_eq!(CalendarWindow::Monthly.period_of(EPOCH), 0);
    }

    #[test]
    fn weeks_start_on_monday() {
        for day in 0..800 {
            let date = EPOCH + chrono::Duration::days(day);
            let period = CalendarWindow::Weekly.period_of(date);
            let first = CalendarWindow::Weekly.first_date(period);
            assert_eq!(first.weekday(), chrono::Weekday::Mon, "{date}");
            assert!(first <= date && (date - first).num_days() < 7, "{date}");
            let month = CalendarWindow::Monthly.period_of(date);
            let first = CalendarWindow::Monthly.first_date(month);
            assert_eq!(
                (first.year(), first.month(), first.day()),
                (date.year(), date.month(), 1)
            );
        }
    }

    #[test]
    fn a_skipped_midnight_starts_the_day_at_the_gap_end() {
        // Santiago moved clocks from 00:00 to 01:00 on 2022-09-11.
        let santiago: Tz = "America/Santiago".parse().unwrap();
        let date = NaiveDate::from_ymd_opt(2022, 9, 11).unwrap();
        let start = local_midnight(santiago, date);
        assert_eq!(local_date(santiago, start), date);
        assert_eq!(local_date(santiago, start - 1), date.pred_opt().unwrap());
    }
}
