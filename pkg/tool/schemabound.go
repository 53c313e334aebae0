package tool

import (
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Bounds on a tool's parameters schema, checked when the tool is added (an MCP server's tools when
// they are listed). The validator follows $ref wherever it leads, applying subschemas to the same
// value without end when references form a cycle that never descends into the value ("$ref": "#",
// or a → b → a through $defs and allOf): the first call's argument check then overflows the stack,
// which ends the process. A recursive schema that descends (a tree: items → "#") is bounded by the
// arguments' own depth and is fine. Fan-out through references (allOf: [A, A], A: allOf: [B, B] …)
// multiplies the work of one value; the bounds keep a check to a few thousand subschemas.
const (
	maxSchemaDepth = 64     // subschemas nested in the schema's JSON
	maxSchemaNodes = 10_000 // subschemas in all
	maxSchemaApply = 10_000 // subschemas one value is checked against at one place, references followed
)

// Schema keywords, by how their subschemas apply: to the same value (sameValue*), or to values inside
// it (inner*); each takes one subschema, a list of them, or a map of them.
var (
	sameValueOne  = []string{"not", "if", "then", "else"}
	sameValueList = []string{"allOf", "anyOf", "oneOf"}
	sameValueMap  = []string{"dependentSchemas", "dependencies"} // draft-07's dependencies: a schema or a list of names
	innerOne      = []string{"additionalProperties", "additionalItems", "items", "contains", "propertyNames",
		"unevaluatedItems", "unevaluatedProperties", "contentSchema"}
	innerList = []string{"prefixItems", "items"} // draft-07's items may be a list
	innerMap  = []string{"properties", "patternProperties", "$defs", "definitions"}
)

// schemaNode is a subschema: where it is (a JSON pointer from the root) and its keywords.
type schemaNode struct {
	ptr  string
	m    map[string]any
	same []*schemaNode // the subschemas applied to the same value, references resolved
}

// schemaBounds walks a parameters schema (its JSON as maps): it is the table of its subschemas by
// pointer, with the names its anchors and $ids give.
type schemaBounds struct {
	root    map[string]any
	nodes   map[string]*schemaNode
	byMap   map[uintptr]*schemaNode // by the identity of their JSON object
	order   []*schemaNode           // in the order they were found
	anchors map[string][]*schemaNode
	ids     map[string]*schemaNode
}

// checkSchemaBounds refuses a parameters schema nested deeper than maxSchemaDepth, with more than
// maxSchemaNodes subschemas, with references that apply a subschema to the same value in a cycle, or
// that make one value checked against more than maxSchemaApply subschemas. A reference it cannot
// follow within the schema is refused too (it could hide a cycle).
func checkSchemaBounds(root map[string]any) error {
	sb := &schemaBounds{root: root, nodes: map[string]*schemaNode{}, byMap: map[uintptr]*schemaNode{}, anchors: map[string][]*schemaNode{}, ids: map[string]*schemaNode{}}
	if err := sb.walk(root, "#", 0); err != nil {
		return err
	}
	for _, n := range sb.order {
		if err := sb.link(n); err != nil {
			return err
		}
	}
	if cyc := sb.cycle(); cyc != nil {
		ptrs := make([]string, len(cyc))
		for i, n := range cyc {
			ptrs[i] = n.ptr
		}
		return fmt.Errorf("$ref cycle: %s applies to the same value forever (its check would never end)", strings.Join(ptrs, " → "))
	}
	memo := map[*schemaNode]int{}
	for _, n := range sb.order {
		if c := sb.applied(n, memo); c > maxSchemaApply {
			return fmt.Errorf("%s: checks one value against more than %d subschemas, references followed", n.ptr, maxSchemaApply)
		}
	}
	return nil
}

// walk registers the subschema m at ptr and the subschemas under it.
func (sb *schemaBounds) walk(m map[string]any, ptr string, depth int) error {
	if depth > maxSchemaDepth {
		return fmt.Errorf("%s: subschemas nested more than %d deep", snippet(ptr, 80), maxSchemaDepth)
	}
	if len(sb.nodes) >= maxSchemaNodes {
		return fmt.Errorf("more than %d subschemas", maxSchemaNodes)
	}
	n := &schemaNode{ptr: ptr, m: m}
	sb.nodes[ptr] = n
	sb.byMap[reflect.ValueOf(m).Pointer()] = n
	sb.order = append(sb.order, n)
	for _, k := range []string{"$anchor", "$dynamicAnchor"} {
		if a, ok := m[k].(string); ok && a != "" {
			sb.anchors[a] = append(sb.anchors[a], n)
		}
	}
	if id, ok := m["$id"].(string); ok && id != "" {
		if a, ok := strings.CutPrefix(id, "#"); ok { // draft-07: an $id that is a fragment is an anchor
			sb.anchors[a] = append(sb.anchors[a], n)
		} else {
			sb.ids[id] = n
		}
	}
	return sb.eachChild(m, ptr, func(c map[string]any, cptr string, _ bool) error { return sb.walk(c, cptr, depth+1) })
}

// eachChild calls fn with each subschema of m that is an object (true and false are leaves), its
// pointer, and whether it applies to the same value as m.
func (sb *schemaBounds) eachChild(m map[string]any, ptr string, fn func(c map[string]any, cptr string, same bool) error) error {
	one := func(keys []string, same bool) error {
		for _, k := range keys {
			if c, ok := m[k].(map[string]any); ok {
				if err := fn(c, ptr+"/"+escapePointer(k), same); err != nil {
					return err
				}
			}
		}
		return nil
	}
	list := func(keys []string, same bool) error {
		for _, k := range keys {
			l, _ := m[k].([]any)
			for i, v := range l {
				if c, ok := v.(map[string]any); ok {
					if err := fn(c, ptr+"/"+escapePointer(k)+"/"+strconv.Itoa(i), same); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
	byName := func(keys []string, same bool) error {
		for _, k := range keys {
			cm, _ := m[k].(map[string]any)
			for _, name := range sortedKeys(cm) {
				if c, ok := cm[name].(map[string]any); ok {
					if err := fn(c, ptr+"/"+escapePointer(k)+"/"+escapePointer(name), same); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
	for _, step := range []func() error{
		func() error { return one(sameValueOne, true) }, func() error { return list(sameValueList, true) },
		func() error { return byName(sameValueMap, true) }, func() error { return one(innerOne, false) },
		func() error { return list(innerList, false) }, func() error { return byName(innerMap, false) },
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// link sets n.same: its same-value subschemas and the targets of its $ref and $dynamicRef.
func (sb *schemaBounds) link(n *schemaNode) error {
	err := sb.eachChild(n.m, n.ptr, func(_ map[string]any, cptr string, same bool) error {
		if same {
			n.same = append(n.same, sb.nodes[cptr])
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range []string{"$ref", "$dynamicRef"} {
		ref, ok := n.m[k].(string)
		if !ok {
			continue
		}
		targets, err := sb.resolve(ref)
		if err != nil {
			return fmt.Errorf("%s: %s %q: %w", n.ptr, k, ref, err)
		}
		n.same = append(n.same, targets...)
	}
	return nil
}

// resolve finds the subschemas a reference names within the schema: a JSON pointer from the root
// (#, #/$defs/a), an anchor (#name: every subschema that declares it, for a $dynamicRef may land on
// any), or an $id, with a fragment after it.
func (sb *schemaBounds) resolve(ref string) ([]*schemaNode, error) {
	base, frag, _ := strings.Cut(ref, "#")
	from := sb.nodes["#"]
	if base != "" {
		from = sb.ids[base]
		if from == nil {
			return nil, fmt.Errorf("not a reference within the schema (drmas follows #-pointers, anchors and the schema's own $ids, to bound it)")
		}
	}
	if frag != "" && !strings.HasPrefix(frag, "/") {
		targets := sb.anchors[frag]
		if len(targets) == 0 {
			return nil, fmt.Errorf("no subschema declares the anchor %q", frag)
		}
		return targets, nil
	}
	if frag == "" {
		return []*schemaNode{from}, nil
	}
	ptr, err := url.PathUnescape(frag)
	if err != nil {
		return nil, fmt.Errorf("bad pointer: %v", err)
	}
	var v any = from.m
	for _, tok := range strings.Split(ptr, "/")[1:] {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		switch x := v.(type) {
		case map[string]any:
			v = x[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) {
				return nil, fmt.Errorf("the pointer leads nowhere")
			}
			v = x[i]
		default:
			return nil, fmt.Errorf("the pointer leads nowhere")
		}
	}
	switch m := v.(type) {
	case bool:
		return nil, nil // true or false: no further subschema
	case map[string]any:
		// The node of that object, however the pointer spells it.
		if n := sb.byMap[reflect.ValueOf(m).Pointer()]; n != nil {
			return []*schemaNode{n}, nil
		}
		return nil, fmt.Errorf("the pointer leads to an object that is not a subschema")
	}
	return nil, fmt.Errorf("the pointer leads nowhere")
}

// cycle returns a cycle of subschemas applied to the same value (the first node again at its end), or
// nil when there is none.
func (sb *schemaBounds) cycle() []*schemaNode {
	const (
		unseen = iota
		open
		done
	)
	state := map[*schemaNode]int{}
	var path []*schemaNode
	var visit func(n *schemaNode) []*schemaNode
	visit = func(n *schemaNode) []*schemaNode {
		state[n] = open
		path = append(path, n)
		for _, c := range n.same {
			switch state[c] {
			case open:
				i := slices.Index(path, c)
				return append(slices.Clone(path[i:]), c)
			case unseen:
				if cyc := visit(c); cyc != nil {
					return cyc
				}
			}
		}
		path = path[:len(path)-1]
		state[n] = done
		return nil
	}
	for _, n := range sb.order {
		if state[n] == unseen {
			if cyc := visit(n); cyc != nil {
				return cyc
			}
		}
	}
	return nil
}

// applied is how many subschemas a value checked against n is checked against (n included),
// references followed, capped past maxSchemaApply; the same-value graph has no cycle.
func (sb *schemaBounds) applied(n *schemaNode, memo map[*schemaNode]int) int {
	if c, ok := memo[n]; ok {
		return c
	}
	c := 1
	for _, s := range n.same {
		if c += sb.applied(s, memo); c > maxSchemaApply {
			c = maxSchemaApply + 1
			break
		}
	}
	memo[n] = c
	return c
}

// escapePointer escapes a key for a JSON pointer (~ as ~0, / as ~1).
func escapePointer(k string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(k)
}

// sortedKeys are m's keys in order, so that walks and errors do not depend on map order.
func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
