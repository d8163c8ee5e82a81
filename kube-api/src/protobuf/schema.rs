//! The schemas: the vendored `generated.proto` files compiled into a
//! descriptor pool (`build.rs`), and what the Go types add to them
//! (`proto/fields.tsv`): each field's JSON name and whether it is a
//! pointer, `omitempty`, `omitzero` or inlined into its parent. Both are read once.

use std::collections::HashMap;
use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, FieldDescriptor, MessageDescriptor};

static DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/k8s.fds"));
static FIELDS: &str = include_str!("../../proto/fields.tsv");

/// Proto package of the API machinery's `metav1` types (`Status`,
/// `DeleteOptions`, `Table`'s neighbours).
pub const META_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";
/// `runtime.Unknown`, the envelope of every protobuf body.
pub const UNKNOWN: &str = "k8s.io.apimachinery.pkg.runtime.Unknown";

/// What the Go struct field behind a proto field says about its JSON form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoField {
    /// The JSON name (`-`: not in JSON; empty for an inlined field).
    pub json: String,
    /// A pointer: on the wire only when set, and then even when zero.
    pub pointer: bool,
    /// `omitempty`: a zero scalar, empty list or empty map is left out of JSON.
    pub omitempty: bool,
    /// `omitzero`: a zero value (for the types here, a zero time) is left out.
    pub omitzero: bool,
    /// `json:",inline"`: the message's JSON fields are its parent's.
    pub inline: bool,
    /// `+listType` (or a patch merge key, `map`; a merge strategy alone, `set`).
    pub list: ListType,
    /// `+listMapKey`s (or the patch merge key), in order.
    pub keys: Vec<String>,
    /// `+mapType=atomic`.
    pub map_atomic: bool,
}

/// How server-side apply treats a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ListType {
    /// Replaced whole.
    #[default]
    Atomic,
    /// Items identified by the values of `keys`.
    Map,
    /// Items identified by their value.
    Set,
}

impl GoField {
    /// What a field the Go types do not describe is taken to be: named as
    /// in the proto, present exactly when it is on the wire.
    fn unknown(name: &str) -> Self {
        GoField {
            json: name.to_owned(),
            pointer: true,
            omitempty: true,
            omitzero: false,
            inline: false,
            list: ListType::Atomic,
            keys: Vec::new(),
            map_atomic: false,
        }
    }
}

/// The pool and the Go field table.
pub struct Schema {
    pool: DescriptorPool,
    fields: HashMap<(String, String), GoField>,
    atomic_structs: std::collections::HashSet<String>,
}

impl Schema {
    /// The schema, loaded on first use.
    pub fn get() -> &'static Schema {
        static SCHEMA: OnceLock<Schema> = OnceLock::new();
        SCHEMA.get_or_init(|| {
            let pool = DescriptorPool::decode(DESCRIPTORS)
                .expect("the descriptor set built by build.rs decodes");
            let mut fields = HashMap::new();
            let mut atomic_structs = std::collections::HashSet::new();
            for line in FIELDS.lines().filter(|l| !l.starts_with('#')) {
                let mut cols = line.split('\t');
                let (Some(message), Some(field), Some(json), flags) = (
                    cols.next(),
                    cols.next(),
                    cols.next(),
                    cols.next().unwrap_or(""),
                ) else {
                    continue;
                };
                let has = |f: &str| flags.split(',').any(|x| x == f);
                if field.is_empty() {
                    if has("atomic") {
                        atomic_structs.insert(message.to_owned());
                    }
                    continue;
                }
                let list = if has("list=map") {
                    ListType::Map
                } else if has("list=set") {
                    ListType::Set
                } else {
                    ListType::Atomic
                };
                let keys = flags
                    .split(',')
                    .filter_map(|f| f.strip_prefix("key="))
                    .map(str::to_owned)
                    .collect();
                fields.insert(
                    (message.to_owned(), field.to_owned()),
                    GoField {
                        json: json.to_owned(),
                        pointer: has("ptr"),
                        omitempty: has("omitempty"),
                        omitzero: has("omitzero"),
                        inline: has("inline"),
                        list,
                        keys,
                        map_atomic: has("map=atomic"),
                    },
                );
            }
            Schema {
                pool,
                fields,
                atomic_structs,
            }
        })
    }

    /// Whether server-side apply treats the message as one value
    /// (`+structType=atomic`, such as a label selector).
    pub fn is_atomic(&self, message: &MessageDescriptor) -> bool {
        self.atomic_structs.contains(message.full_name())
    }

    /// A message by its full name.
    pub fn message(&self, full_name: &str) -> Option<MessageDescriptor> {
        self.pool.get_message_by_name(full_name)
    }

    /// The Go side of `field` of `message`.
    pub fn go_field(&self, message: &MessageDescriptor, field: &FieldDescriptor) -> GoField {
        self.fields
            .get(&(message.full_name().to_owned(), field.name().to_owned()))
            .cloned()
            .unwrap_or_else(|| GoField::unknown(field.name()))
    }

    /// The message of objects of `kind` in `apiVersion`, if the group is a
    /// built-in one whose schema is vendored.
    pub fn kind(&self, api_version: &str, kind: &str) -> Option<MessageDescriptor> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        if kind.is_empty() || version.is_empty() || kind.contains('.') {
            return None;
        }
        let package = proto_package(group)?;
        self.message(&format!("{package}.{version}.{kind}"))
            .or_else(|| {
                // Kinds of the API machinery (`Status`, `DeleteOptions`) are
                // served in every group version.
                self.message(&format!("{META_V1}.{kind}")).filter(|m| {
                    m.get_field_by_name("metadata").is_some() || kind == "DeleteOptions"
                })
            })
    }
}

/// The proto package (without the version) of a built-in API group:
/// `k8s.io.api.` and the group's first label, as `k8s.io/api` names its
/// folders. Groups of other repositories (`apiextensions.k8s.io`,
/// `apiregistration.k8s.io`) and custom resources' groups have none here.
pub fn proto_package(group: &str) -> Option<String> {
    let folder = match group {
        "" => "core",
        "internal.apiserver.k8s.io" => "apiserverinternal",
        "apiextensions.k8s.io" | "apiregistration.k8s.io" => return None,
        g if g == g.split('.').next().unwrap_or(g) || g.ends_with(".k8s.io") => {
            g.split('.').next().unwrap_or(g)
        }
        _ => return None,
    };
    Some(format!("k8s.io.api.{folder}"))
}
