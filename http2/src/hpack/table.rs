//! HPACK's static table (RFC 7541 Appendix A) and the dynamic table both
//! sides keep (§2.3.2, §4): newest entry first, each entry costing its name
//! and value lengths plus 32 octets, evicted oldest first to stay within the
//! size the decoder allows.

use std::collections::VecDeque;

/// The static table; index 1 is the first entry.
pub const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// What each entry costs beyond its name and value (§4.1).
pub const ENTRY_OVERHEAD: usize = 32;

/// One dynamic table entry: name and value in one allocation.
#[derive(Debug, Clone)]
struct Entry {
    bytes: Box<[u8]>,
    name_len: usize,
}

impl Entry {
    fn name(&self) -> &[u8] {
        &self.bytes[..self.name_len]
    }

    fn value(&self) -> &[u8] {
        &self.bytes[self.name_len..]
    }

    fn size(&self) -> usize {
        self.bytes.len() + ENTRY_OVERHEAD
    }
}

/// A dynamic table.
#[derive(Debug, Clone, Default)]
pub struct Dynamic {
    entries: VecDeque<Entry>,
    size: usize,
    max: usize,
}

impl Dynamic {
    /// An empty table holding at most `max` octets.
    pub fn new(max: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            size: 0,
            max,
        }
    }

    /// Its current maximum size.
    pub fn max_size(&self) -> usize {
        self.max
    }

    /// Its current size.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sets the maximum size, evicting as needed.
    pub fn set_max_size(&mut self, max: usize) {
        self.max = max;
        self.evict(0);
        if self.entries.is_empty() {
            // An emptied table gives its memory back.
            self.entries = VecDeque::new();
        }
    }

    fn evict(&mut self, room: usize) {
        while self.size + room > self.max {
            match self.entries.pop_back() {
                Some(e) => self.size -= e.size(),
                None => break,
            }
        }
    }

    /// Adds an entry (§4.4): older entries are evicted to make room; an entry
    /// larger than the whole table empties it and is not added.
    pub fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        if size > self.max {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict(size);
        let mut bytes = Vec::with_capacity(name.len() + value.len());
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(value);
        self.entries.push_front(Entry {
            bytes: bytes.into_boxed_slice(),
            name_len: name.len(),
        });
        self.size += size;
    }

    /// Entry `i` (0 is the newest) as (name, value).
    pub fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        self.entries.get(i).map(|e| (e.name(), e.value()))
    }

    /// The newest entry matching `name` and `value` exactly, and the newest
    /// matching `name` alone, as 0-based positions.
    pub fn find(&self, name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
        let mut by_name = None;
        for (i, e) in self.entries.iter().enumerate() {
            if e.name() == name {
                if e.value() == value {
                    return (Some(i), by_name.or(Some(i)));
                }
                by_name.get_or_insert(i);
            }
        }
        (None, by_name)
    }
}

/// The static entry with exactly `name` and `value`, and the first with
/// `name`, as 1-based indices.
pub fn find_static(name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
    let mut by_name = None;
    for (i, (n, v)) in STATIC.iter().enumerate() {
        if n.as_bytes() == name {
            if v.as_bytes() == value {
                return (Some(i + 1), by_name.or(Some(i + 1)));
            }
            by_name.get_or_insert(i + 1);
        }
    }
    (None, by_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_evicted_oldest_first() {
        let mut t = Dynamic::new(100);
        t.insert(b"a", b"1"); // 34
        t.insert(b"b", b"2"); // 68
        t.insert(b"c", b"3"); // 102 > 100: "a" goes
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(0), Some((&b"c"[..], &b"3"[..])));
        assert_eq!(t.get(1), Some((&b"b"[..], &b"2"[..])));
        assert_eq!(t.size(), 68);
        t.set_max_size(40);
        assert_eq!(t.len(), 1);
        t.insert(&[b'x'; 100], b"");
        assert!(t.is_empty(), "an oversized entry empties the table");
        assert_eq!(t.size(), 0);
    }

    #[test]
    fn static_lookup() {
        assert_eq!(find_static(b":method", b"POST"), (Some(3), Some(2)));
        assert_eq!(
            find_static(b"content-type", b"application/grpc"),
            (None, Some(31))
        );
        assert_eq!(find_static(b"x-none", b""), (None, None));
        assert_eq!(STATIC[61 - 1].0, "www-authenticate");
    }
}
