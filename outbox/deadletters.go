package outbox

// DeadLetterQuery asks a store for one page of a namespace's dead letters
// (failed rows), in dispatch_key order, bounded in rows and in bytes, with
// or without payloads: what a node's dead-letter listing reads, so a
// request holds about its byte budget whatever the payload sizes.
type DeadLetterQuery struct {
	// After is the dispatch_key the page starts after ("" from the first).
	After string
	// Through, when set, ends the page at this dispatch_key (included):
	// rows after it are not returned.
	Through string
	// Limit bounds the page's rows; ≤ 0 returns nothing.
	Limit int
	// MaxBytes bounds the page's size as RowBytes counts it (the payload
	// included unless left out): a page holds at least one row when one
	// remains, even a larger one; after the first, rows are added while the
	// total stays ≤ MaxBytes. ≤ 0 means no byte bound.
	MaxBytes int
	// WithoutPayload leaves every row's Payload nil (a store need not even
	// copy it); PayloadBytes still gives its size.
	WithoutPayload bool
	// Keep, when set, selects the rows the page may hold by dispatch_key
	// (e.g. only the shards this node is primary of): a row it refuses is
	// skipped before it is read, counts toward neither Limit nor MaxBytes,
	// and does not end the page. It is called inside the store's read (a
	// bbolt read transaction, memstore's lock): it must be cheap and must
	// not call back into the store.
	Keep func(dispatchKey string) bool
}

// DeadLetterPage is one page of a DeadLetterQuery.
type DeadLetterPage struct {
	// Rows are failed rows ordered by dispatch_key; the caller's copies.
	Rows []Row
	// PayloadBytes[i] is the size in bytes of Rows[i]'s payload, also when
	// the query left it out.
	PayloadBytes []int
	// More reports that the page was cut by Limit or MaxBytes: the
	// namespace has dead letters in this store after the page's last row
	// (and not after Through, when set).
	More bool
}
