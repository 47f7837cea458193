//! Variables under the configuration's prefix that name no key: a misspelt override
//! (`ORDERS_CONCURENCY`) would otherwise be ignored without a word.

use super::keys::DEFAULT_ENV_PREFIX;
use super::keys::KEYS;

/// A variable under the configuration's prefix that is no key's override: ignored when the
/// configuration loads, and most likely a misspelling of [`UnknownVariable::nearest`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnknownVariable {
    /// The variable as set (`ORDERS_CONCURENCY`).
    pub name: String,
    /// The known variable nearest to it, under the same prefix (`ORDERS_CONCURRENCY`).
    pub nearest: String,
}

/// Each of `names` that starts with `prefix` and is no key's variable, with the nearest one
/// (fewest single-character edits).
pub(super) fn unknown<I, S>(prefix: &str, names: I) -> Vec<UnknownVariable>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let known: Vec<&str> = KEYS
        .iter()
        .filter_map(|key| key.env.strip_prefix(DEFAULT_ENV_PREFIX))
        .collect();
    let mut found: Vec<UnknownVariable> = names
        .into_iter()
        .filter_map(|name| {
            let name = name.as_ref();
            let rest = name.strip_prefix(prefix)?;
            if known.contains(&rest) {
                return None;
            }
            let nearest = known.iter().min_by_key(|k| distance(rest, k))?;
            Some(UnknownVariable {
                name: name.to_owned(),
                nearest: format!("{prefix}{nearest}"),
            })
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

/// Levenshtein distance over bytes (variable names are ASCII).
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, &x) in a.iter().enumerate() {
        let mut current = Vec::with_capacity(b.len() + 1);
        current.push(i + 1);
        for (j, &y) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(x != y);
            current.push(substitute.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}
