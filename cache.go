package idem

import (
	"sync"
	"time"
)

// resultCache is a bounded LRU of completed results. A hit takes one mutex
// and allocates nothing.
type resultCache struct {
	mu    sync.Mutex
	max   int
	items map[string]*cacheNode
	head  cacheNode // sentinel: head.next is the most recent
}

type cacheEntry struct {
	value       []byte
	fingerprint string
	attempt     int
	fence       int64
	expires     time.Time // local clock
}

type cacheNode struct {
	key        string
	entry      cacheEntry
	prev, next *cacheNode
}

func newResultCache(n int) *resultCache {
	c := &resultCache{max: n, items: make(map[string]*cacheNode, n)}
	c.head.next, c.head.prev = &c.head, &c.head
	return c
}

func (c *resultCache) get(key string, now time.Time) (cacheEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.items[key]
	if !ok {
		return cacheEntry{}, false
	}
	if !now.Before(n.entry.expires) {
		c.unlink(n)
		delete(c.items, key)
		return cacheEntry{}, false
	}
	c.unlink(n)
	c.pushFront(n)
	return n.entry, true
}

func (c *resultCache) put(key string, e cacheEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := c.items[key]; ok {
		n.entry = e
		c.unlink(n)
		c.pushFront(n)
		return
	}
	if len(c.items) >= c.max {
		old := c.head.prev
		c.unlink(old)
		delete(c.items, old.key)
	}
	n := &cacheNode{key: key, entry: e}
	c.items[key] = n
	c.pushFront(n)
}

func (c *resultCache) unlink(n *cacheNode) {
	n.prev.next, n.next.prev = n.next, n.prev
}

func (c *resultCache) pushFront(n *cacheNode) {
	n.prev, n.next = &c.head, c.head.next
	c.head.next.prev = n
	c.head.next = n
}
