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

/// The static entries named `name`: the first index and how many there are
/// (entries of one name are adjacent).
fn static_names(name: &[u8]) -> Option<(usize, usize)> {
    Some(match name {
        b":authority" => (1, 1),
        b":method" => (2, 2),
        b":path" => (4, 2),
        b":scheme" => (6, 2),
        b":status" => (8, 7),
        b"accept-charset" => (15, 1),
        b"accept-encoding" => (16, 1),
        b"accept-language" => (17, 1),
        b"accept-ranges" => (18, 1),
        b"accept" => (19, 1),
        b"access-control-allow-origin" => (20, 1),
        b"age" => (21, 1),
        b"allow" => (22, 1),
        b"authorization" => (23, 1),
        b"cache-control" => (24, 1),
        b"content-disposition" => (25, 1),
        b"content-encoding" => (26, 1),
        b"content-language" => (27, 1),
        b"content-length" => (28, 1),
        b"content-location" => (29, 1),
        b"content-range" => (30, 1),
        b"content-type" => (31, 1),
        b"cookie" => (32, 1),
        b"date" => (33, 1),
        b"etag" => (34, 1),
        b"expect" => (35, 1),
        b"expires" => (36, 1),
        b"from" => (37, 1),
        b"host" => (38, 1),
        b"if-match" => (39, 1),
        b"if-modified-since" => (40, 1),
        b"if-none-match" => (41, 1),
        b"if-range" => (42, 1),
        b"if-unmodified-since" => (43, 1),
        b"last-modified" => (44, 1),
        b"link" => (45, 1),
        b"location" => (46, 1),
        b"max-forwards" => (47, 1),
        b"proxy-authenticate" => (48, 1),
        b"proxy-authorization" => (49, 1),
        b"range" => (50, 1),
        b"referer" => (51, 1),
        b"refresh" => (52, 1),
        b"retry-after" => (53, 1),
        b"server" => (54, 1),
        b"set-cookie" => (55, 1),
        b"strict-transport-security" => (56, 1),
        b"transfer-encoding" => (57, 1),
        b"user-agent" => (58, 1),
        b"vary" => (59, 1),
        b"via" => (60, 1),
        b"www-authenticate" => (61, 1),
        _ => return None,
    })
}

/// The static entry with exactly `name` and `value`, and the first with
/// `name`, as 1-based indices.
pub fn find_static(name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
    let Some((first, count)) = static_names(name) else {
        return (None, None);
    };
    let exact = (first..first + count).find(|&i| STATIC[i - 1].1.as_bytes() == value);
    (exact, Some(first))
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
    fn the_name_lookup_agrees_with_the_table() {
        for (i, (name, value)) in STATIC.iter().enumerate() {
            let (exact, by_name) = find_static(name.as_bytes(), value.as_bytes());
            assert_eq!(exact, Some(i + 1), "{name}: {value}");
            let first = STATIC.iter().position(|(n, _)| n == name).unwrap() + 1;
            assert_eq!(by_name, Some(first), "{name}");
        }
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
