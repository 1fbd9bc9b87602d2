package rlhttp

import "strings"

// MatchPath reports whether the normalised path (NormalizePath) matches pattern, with the
// pattern syntax of the Rust layer's PathPattern and the Python package's exempt paths:
//
//   - a glob when the pattern holds '*': '*' matches any run of characters ('/' included),
//     '?' one character, "[abc]" / "[a-z]" one of a set and "[!abc]" one outside it; a '['
//     that is never closed is a literal '[' ("/users/*/avatar", "/v[0-9]/*");
//   - else a prefix when it ends with '/': "/api/" matches "/api/x/y" and "/api" itself;
//   - else the exact path ("/health", which "/health/" and "//health" normalise to).
//
// Matching is case-sensitive and on characters, not bytes.
func MatchPath(pattern, path string) bool {
	switch {
	case strings.Contains(pattern, "*"):
		return glob([]rune(pattern), []rune(path))
	case strings.HasSuffix(pattern, "/"):
		bare := strings.TrimRight(pattern, "/")
		if bare == "" {
			bare = "/"
		}
		return strings.HasPrefix(path, pattern) || path == bare
	}
	return path == NormalizePath(pattern)
}

// glob matches text against a shell-style pattern as a whole, backtracking to the last '*'.
func glob(pattern, text []rune) bool {
	p, t := 0, 0
	starP, starT := -1, -1
	for t < len(text) {
		if p < len(pattern) {
			switch c := pattern[p]; c {
			case '*':
				starP, starT = p, t
				p++
				continue
			case '?':
				p++
				t++
				continue
			case '[':
				if matched, next, closed := inClass(pattern, p, text[t]); closed {
					if matched {
						p, t = next, t+1
						continue
					}
				} else if text[t] == '[' {
					p, t = p+1, t+1
					continue
				}
			default:
				if c == text[t] {
					p, t = p+1, t+1
					continue
				}
			}
		}
		if starP < 0 {
			return false
		}
		starT++
		p, t = starP+1, starT
	}
	for ; p < len(pattern); p++ {
		if pattern[p] != '*' {
			return false
		}
	}
	return true
}

// inClass matches c against the class that opens at pattern[start] ('['): whether it
// matched, the index after the class, and whether the class is closed at all (an unclosed
// '[' is a literal).
func inClass(pattern []rune, start int, c rune) (matched bool, next int, closed bool) {
	i := start + 1
	negate := i < len(pattern) && pattern[i] == '!'
	if negate {
		i++
	}
	first := i
	for i < len(pattern) {
		if pattern[i] == ']' && i > first {
			return matched != negate, i + 1, true
		}
		if i+2 < len(pattern) && pattern[i+1] == '-' && pattern[i+2] != ']' {
			if pattern[i] <= c && c <= pattern[i+2] {
				matched = true
			}
			i += 3
			continue
		}
		if pattern[i] == c {
			matched = true
		}
		i++
	}
	return false, 0, false
}
