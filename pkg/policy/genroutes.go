package policy

// Generation's routing record and replay (RowOptions.Record, RowOptions.Replay; routing.go): the
// prefill routes each row's prompt tokens, each decoding step the token it feeds, every row its own.

// routesWanted says whether any of rows records or replays routes.
func routesWanted(rows []*row) bool {
	for _, r := range rows {
		if r.opt.Record != nil || r.opt.Replay != nil {
			return true
		}
	}
	return false
}

// prefillRouting is the routing of a prefill of rows left-padded to tp tokens on m: nil when no row
// records or replays routes.
func (e *engine) prefillRouting(m *Model, rows []*row, tp int64) *routing {
	if !routesWanted(rows) {
		return nil
	}
	toks := make([]routeToken, int64(len(rows))*tp)
	keep := false
	for i, r := range rows {
		pad := tp - int64(len(r.prompt))
		for j := pad; j < tp; j++ {
			toks[int64(i)*tp+j] = routeToken{given: r.opt.Replay, at: int(j - pad), replay: true, real: true}
		}
		keep = keep || r.opt.Record != nil
	}
	return m.newRouting(toks, keep, false)
}

// keepPrefillRoutes appends to each recording row the experts of its prompt tokens.
func (e *engine) keepPrefillRoutes(rt *routing, rows []*row, tp int64) {
	used := rt.usedValues()
	if used == nil {
		return
	}
	for i, r := range rows {
		if r.opt.Record != nil {
			P := len(r.prompt)
			r.routes = append(r.routes, rt.routesOf(used, i*int(tp)+int(tp)-P, 0, P).IDs...)
		}
	}
}

// decodeRouting is the routing of a decoding step of the rows in slots on m (a finished row rides
// along unrouted): nil when no live row records or replays routes.
func (e *engine) decodeRouting(m *Model, slots []int64) *routing {
	want := false
	for _, b := range slots {
		r := e.rows[b]
		want = want || (!r.done && (r.opt.Record != nil || r.opt.Replay != nil))
	}
	if !want {
		return nil
	}
	toks := make([]routeToken, len(slots))
	keep := false
	for i, b := range slots {
		r := e.rows[b]
		if r.done {
			continue
		}
		toks[i] = routeToken{given: r.opt.Replay, at: len(r.prompt) + len(r.resp) - 1, replay: true, real: true}
		keep = keep || r.opt.Record != nil
	}
	return m.newRouting(toks, keep, false)
}

// keepDecodeRoutes appends to each live recording row the experts of the token it fed.
func (e *engine) keepDecodeRoutes(rt *routing, slots []int64) {
	used := rt.usedValues()
	if used == nil {
		return
	}
	for i, b := range slots {
		if r := e.rows[b]; !r.done && r.opt.Record != nil {
			r.routes = append(r.routes, rt.routesOf(used, i, 0, 1).IDs...)
		}
	}
}
