package redisrl

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// maxLiteral is the most UTF-8 bytes a value keeps as itself in a key; longer ones are
// hashed.
const maxLiteral = 128

func safeByte(b byte) bool {
	return b >= 'A' && b <= 'Z' || b >= 'a' && b <= 'z' || b >= '0' && b <= '9' ||
		strings.IndexByte("._:@/+=-", b) >= 0
}

// SafeKeyPart makes a client-supplied value safe inside a Redis key
// (docs/clients.md#escaped-values): every byte but A-Z a-z 0-9 . _ : @ / + = - is
// percent-encoded (upper-case hex: braces, spaces, control bytes, %, ~), so no value can
// pick a hash tag; a value of more than 128 bytes is "~sha256:" and the lower-case hex
// SHA-256 of its bytes. A literal value never starts with '~' (it is %7E), so no value a
// client sends can produce another value's hashed form. The Python and Rust packages spell
// keys byte for byte the same, so services in the three languages share buckets.
func SafeKeyPart(value string) string {
	if len(value) > maxLiteral {
		sum := sha256.Sum256([]byte(value))
		return "~sha256:" + hex.EncodeToString(sum[:])
	}
	const digits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(value))
	for i := 0; i < len(value); i++ {
		c := value[i]
		if safeByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(digits[c>>4])
		b.WriteByte(digits[c&15])
	}
	return b.String()
}

// Tag builds a Cluster-safe key: Tag("user42", "rpm") is "{user42}:rpm". Keys built with one
// hash tag live in one Cluster slot, as CheckAll and a lease used with other limits need.
// The tag may not be empty or hold braces (an error matching ErrUsage).
func Tag(hashTag string, parts ...string) (string, error) {
	if hashTag == "" || strings.ContainsAny(hashTag, "{}") {
		return "", usage("hash tag must be non-empty and hold no braces")
	}
	var b strings.Builder
	b.WriteString("{" + hashTag + "}")
	for _, p := range parts {
		b.WriteByte(':')
		b.WriteString(p)
	}
	return b.String(), nil
}

// IdentityKey is the key layout every package spells the same
// (docs/clients.md#key-layout): "<name>:{<kind>:<escaped value>}", or, with a hash tag,
// "{<hashTag>}:<name>:<kind>:<escaped value>". kind is "ip", "hdr.<lower-case header
// name>", "user", "route", or a custom key function's kind ("fn" by default). name, kind
// and value are each escaped with SafeKeyPart, as the Python package does; the hash tag is
// the rule's own (no braces). The client's prefix is added when the key is sent.
func IdentityKey(name, kind, value, hashTag string) string {
	n, k, v := SafeKeyPart(name), SafeKeyPart(kind), SafeKeyPart(value)
	if hashTag != "" {
		return "{" + hashTag + "}:" + n + ":" + k + ":" + v
	}
	return n + ":{" + k + ":" + v + "}"
}
