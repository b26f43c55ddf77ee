//! The limits file (`rate_limits_file`), in envoyproxy/ratelimit's YAML format, and how a
//! request descriptor finds its limit in it.
//!
//! A file holds one domain per YAML document (`---` between them):
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   - key: remote_address          # no value: every address its own bucket
//!     rate_limit: {unit: second, requests_per_unit: 10}
//!   - key: tenant
//!     value: acme
//!     rate_limit: {unit: minute, requests_per_unit: 600}
//!     descriptors:                 # nested: tenant=acme, then path=...
//!       - key: path
//!         rate_limit: {unit: second, requests_per_unit: 5}
//!         shadow_mode: true        # counted, never enforced
//!   - key: health
//!     rate_limit: {unlimited: true}
//! ```
//!
//! Matching follows envoyproxy/ratelimit: a descriptor's entries are walked level by level,
//! each entry matching the rule with its key and value, else the rule with its key and no
//! value. The limit is the rule matched by the last entry, if it has one; a walk that
//! stops early has no limit. Values with a trailing `*` (prefix matches) are not supported
//! and are refused by name.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

/// A limit's unit of time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
}

impl Unit {
    /// The unit in microseconds.
    pub fn us(self) -> u64 {
        match self {
            Unit::Second => 1_000_000,
            Unit::Minute => 60_000_000,
            Unit::Hour => 3_600_000_000,
            Unit::Day => 86_400_000_000,
        }
    }
}

/// What a matched rule says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Never limited.
    Unlimited,
    /// `requests_per_unit` per `unit`, as a GCRA bucket of one unit's capacity.
    Rate {
        unit: Unit,
        requests_per_unit: u32,
        name: String,
        /// Counted but never enforced: an over-limit answer says OK.
        shadow: bool,
    },
}

#[derive(Debug, Default)]
struct Level {
    by_value: HashMap<(String, String), Rule>,
    by_key: HashMap<String, Rule>,
}

#[derive(Debug)]
struct Rule {
    limit: Option<Limit>,
    children: Level,
}

/// Every domain of the limits file.
#[derive(Debug, Default)]
pub struct Limits {
    domains: HashMap<String, Level>,
}

/// The limits file could not be used; the message names the file and the field.
#[derive(Debug, thiserror::Error)]
#[error("rate_limits_file {path}: {reason}")]
pub struct LimitsError {
    path: String,
    reason: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DomainFile {
    domain: String,
    #[serde(default)]
    descriptors: Vec<DescriptorFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorFile {
    key: String,
    value: Option<String>,
    rate_limit: Option<RateLimitFile>,
    #[serde(default)]
    descriptors: Vec<DescriptorFile>,
    #[serde(default)]
    shadow_mode: bool,
    /// Accepted for compatibility; per-descriptor metrics are not kept.
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitFile {
    unit: Option<String>,
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
}

impl Level {
    fn longest_unit_us(&self) -> u64 {
        let rules = self.by_value.values().chain(self.by_key.values());
        rules
            .map(|rule| {
                let own = match &rule.limit {
                    Some(Limit::Rate { unit, .. }) => unit.us(),
                    _ => 0,
                };
                own.max(rule.children.longest_unit_us())
            })
            .max()
            .unwrap_or(0)
    }
}

impl Limits {
    /// The longest unit of any rate limit in the file, in microseconds (0: none): each
    /// becomes a bucket of that capacity, which must be within the node's
    /// `capacity_us_max`.
    pub fn longest_unit_us(&self) -> u64 {
        let levels = self.domains.values();
        levels.map(Level::longest_unit_us).max().unwrap_or(0)
    }

    /// Reads and checks a limits file.
    ///
    /// # Errors
    /// When the file cannot be read, is not YAML of this shape, or a rule is wrong (the
    /// error names the domain and the field).
    pub fn load(path: &Path) -> Result<Self, LimitsError> {
        let fail = |reason: String| LimitsError {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        Self::from_yaml(&text).map_err(fail)
    }

    /// Parses and checks the text of a limits file.
    ///
    /// # Errors
    /// The reason, naming the domain and the field.
    pub fn from_yaml(text: &str) -> Result<Self, String> {
        let mut limits = Limits::default();
        for document in serde_yaml_ng::Deserializer::from_str(text) {
            let file = DomainFile::deserialize(document).map_err(|e| e.to_string())?;
            if file.domain.is_empty() {
                return Err("domain: must not be empty".to_owned());
            }
            if limits.domains.contains_key(&file.domain) {
                return Err(format!("domain `{}`: given twice", file.domain));
            }
            let at = format!("domain `{}`", file.domain);
            let level = rules_of(&file.descriptors, &at)?;
            limits.domains.insert(file.domain, level);
        }
        Ok(limits)
    }

    /// The limit for one request descriptor (its entries as key, value) in `domain`.
    pub fn limit(&self, domain: &str, entries: &[(&str, &str)]) -> Option<&Limit> {
        let mut level = self.domains.get(domain)?;
        for (i, (key, value)) in entries.iter().enumerate() {
            let rule = level
                .by_value
                .get(&((*key).to_owned(), (*value).to_owned()))
                .or_else(|| level.by_key.get(*key))?;
            if i + 1 == entries.len() {
                return rule.limit.as_ref();
            }
            level = &rule.children;
        }
        None
    }

    /// How many domains the file holds.
    pub fn domains(&self) -> usize {
        self.domains.len()
    }
}

fn rules_of(descriptors: &[DescriptorFile], at: &str) -> Result<Level, String> {
    let mut level = Level::default();
    for (i, descriptor) in descriptors.iter().enumerate() {
        let here = format!("{at}, descriptors[{i}]");
        if descriptor.key.is_empty() {
            return Err(format!("{here}.key: must not be empty"));
        }
        let limit = descriptor
            .rate_limit
            .as_ref()
            .map(|rate| limit(rate, descriptor.shadow_mode, &here))
            .transpose()?;
        let rule = Rule {
            limit,
            children: rules_of(&descriptor.descriptors, &here)?,
        };
        // An empty value is no value, as envoyproxy/ratelimit reads it: a key-only rule.
        let value = descriptor.value.as_ref().filter(|value| !value.is_empty());
        let taken = match value {
            Some(value) if value.ends_with('*') => {
                return Err(format!(
                    "{here}.value: `{value}`: prefix matches (a trailing *) are not supported"
                ))
            }
            Some(value) => level
                .by_value
                .insert((descriptor.key.clone(), value.clone()), rule)
                .is_some(),
            None => level.by_key.insert(descriptor.key.clone(), rule).is_some(),
        };
        if taken {
            return Err(format!(
                "{here}: key `{}` with value {:?} is given twice at this level",
                descriptor.key, descriptor.value
            ));
        }
    }
    Ok(level)
}

fn limit(rate: &RateLimitFile, shadow: bool, here: &str) -> Result<Limit, String> {
    if rate.unlimited {
        if rate.unit.is_some() || rate.requests_per_unit.is_some() {
            return Err(format!(
                "{here}.rate_limit: unlimited takes no unit or requests_per_unit"
            ));
        }
        return Ok(Limit::Unlimited);
    }
    let unit = match rate.unit.as_deref().map(str::to_ascii_lowercase).as_deref() {
        Some("second") => Unit::Second,
        Some("minute") => Unit::Minute,
        Some("hour") => Unit::Hour,
        Some("day") => Unit::Day,
        Some(other) => {
            return Err(format!(
                "{here}.rate_limit.unit: `{other}` is not second, minute, hour or day"
            ))
        }
        None => return Err(format!("{here}.rate_limit.unit: missing")),
    };
    let requests_per_unit = match rate.requests_per_unit {
        Some(0) | None => {
            return Err(format!(
                "{here}.rate_limit.requests_per_unit: must be at least 1"
            ))
        }
        // Each hit must cost at least a microsecond of the unit.
        Some(n) if u64::from(n) > unit.us() => {
            return Err(format!(
                "{here}.rate_limit.requests_per_unit: {n} is more than one per microsecond"
            ))
        }
        Some(n) => n,
    };
    Ok(Limit::Rate {
        unit,
        requests_per_unit,
        name: rate.name.clone().unwrap_or_default(),
        shadow,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 600}
    descriptors:
      - key: path
        rate_limit: {unit: SECOND, requests_per_unit: 5}
        shadow_mode: true
  - key: tenant
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: hour, requests_per_unit: 3, name: logins}
  - key: health
    rate_limit: {unlimited: true}
---
domain: other
descriptors:
  - key: k
    rate_limit: {unit: day, requests_per_unit: 1}
";

    fn rate(unit: Unit, requests_per_unit: u32, name: &str, shadow: bool) -> Limit {
        Limit::Rate {
            unit,
            requests_per_unit,
            name: name.to_owned(),
            shadow,
        }
    }

    #[test]
    fn a_descriptor_takes_the_limit_its_last_entry_matches() {
        let limits = Limits::from_yaml(FILE).expect("valid");
        assert_eq!(limits.domains(), 2);
        let second = rate(Unit::Second, 10, "", false);
        assert_eq!(
            limits.limit("edge", &[("remote_address", "10.0.0.1")]),
            Some(&second)
        );
        assert_eq!(
            limits.limit("edge", &[("tenant", "acme")]),
            Some(&rate(Unit::Minute, 600, "", false))
        );
        assert_eq!(
            limits.limit("edge", &[("tenant", "acme"), ("path", "/x")]),
            Some(&rate(Unit::Second, 5, "", true)),
            "nested, shadow mode, the unit in capitals"
        );
        // Another tenant falls to the key-only rule, which has no limit of its own.
        assert_eq!(limits.limit("edge", &[("tenant", "zed")]), None);
        assert_eq!(
            limits.limit("edge", &[("tenant", "zed"), ("path", "/login")]),
            Some(&rate(Unit::Hour, 3, "logins", false))
        );
        assert_eq!(
            limits.limit("edge", &[("tenant", "zed"), ("path", "/x")]),
            None
        );
        assert_eq!(
            limits.limit("edge", &[("health", "")]),
            Some(&Limit::Unlimited)
        );
        // `value: ""` is a key-only rule, as envoyproxy/ratelimit reads it.
        let empty = Limits::from_yaml(
            "domain: d\ndescriptors:\n  - key: k\n    value: \"\"\n    rate_limit: {unlimited: true}\n",
        )
        .expect("valid");
        assert_eq!(empty.limit("d", &[("k", "any")]), Some(&Limit::Unlimited));
        // A walk that stops before its last entry has no limit.
        assert_eq!(
            limits.limit("edge", &[("remote_address", "a"), ("deeper", "b")]),
            None
        );
        assert_eq!(limits.limit("edge", &[("unknown", "x")]), None);
        assert_eq!(limits.limit("nowhere", &[("remote_address", "a")]), None);
        assert_eq!(limits.limit("edge", &[]), None);
        assert_eq!(
            limits.limit("other", &[("k", "v")]),
            Some(&rate(Unit::Day, 1, "", false))
        );
    }

    /// What the node checks against `capacity_us_max` at start: the longest unit, nested
    /// rules included.
    #[test]
    fn the_longest_unit_is_found_at_any_depth() {
        let limits = Limits::from_yaml(FILE).expect("valid");
        assert_eq!(limits.longest_unit_us(), Unit::Day.us());
        assert_eq!(Limits::default().longest_unit_us(), 0);
    }

    #[test]
    fn a_wrong_rule_is_refused_naming_its_place() {
        let refused = |text: &str| Limits::from_yaml(text).expect_err("refused");
        let err = refused(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: week, requests_per_unit: 1}\n",
        );
        assert!(
            err.contains("domain `d`, descriptors[0].rate_limit.unit"),
            "{err}"
        );
        let err = refused(
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 0}\n",
        );
        assert!(
            err.contains("descriptors[0], descriptors[0].rate_limit.requests_per_unit"),
            "{err}"
        );
        let err = refused("domain: d\ndescriptors:\n  - key: a\n  - key: a\n");
        assert!(err.contains("given twice"), "{err}");
        let err = refused("domain: d\ndescriptors:\n  - key: a\n    value: pre*\n");
        assert!(err.contains("prefix"), "{err}");
        let err = refused("domain: d\ndescriptors:\n  - key: a\n    surprise: 1\n");
        assert!(err.contains("surprise"), "{err}");
        let err = refused(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 2000000}\n",
        );
        assert!(err.contains("more than one per microsecond"), "{err}");
        let err = refused("domain: d\n---\ndomain: d\n");
        assert!(err.contains("given twice"), "{err}");
        let err = refused(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
        );
        assert!(err.contains("unlimited takes no unit"), "{err}");
    }
}
