package redisstore

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
)

// Durability is what a Redis server is configured to do with the writes
// it acknowledges (see the package doc).
type Durability struct {
	AppendOnly  bool   // appendonly yes: writes go to the append-only file
	AppendFsync string // always, everysec or no: when the AOF is fsynced
	Snapshots   bool   // save is set: RDB snapshots are taken
	Role        string // master, or slave for a replica
	Replicas    int    // replicas connected to this server
}

// Durable reports whether a write the server acknowledged survives a crash
// of the server: appendonly yes with appendfsync always. It says nothing
// about failovers (see [WithWait]).
func (d Durability) Durable() bool { return d.AppendOnly && d.AppendFsync == "always" }

// String describes d in one line, for logs.
func (d Durability) String() string {
	return fmt.Sprintf("appendonly=%v appendfsync=%s snapshots=%v role=%s replicas=%d durable=%v",
		d.AppendOnly, d.AppendFsync, d.Snapshots, d.Role, d.Replicas, d.Durable())
}

// Durability reads the persistence and replication settings of the server
// the store's client reaches (CONFIG GET and INFO replication; on a
// cluster, of the node the client picks). Managed services that disable
// CONFIG make it fail. A program that runs AtMostOnce operations can check
// Durable at start and refuse to run on a server that loses writes.
func (s *Store) Durability(ctx context.Context) (Durability, error) {
	if err := s.check(ctx); err != nil {
		return Durability{}, err
	}
	cfg, err := s.client.ConfigGet(ctx, "app*").Result()
	if err != nil {
		return Durability{}, s.wrap("durability", "", err)
	}
	save, err := s.client.ConfigGet(ctx, "save").Result()
	if err != nil {
		return Durability{}, s.wrap("durability", "", err)
	}
	info, err := s.client.Info(ctx, "replication").Result()
	if err != nil {
		return Durability{}, s.wrap("durability", "", err)
	}
	d := Durability{
		AppendOnly:  cfg["appendonly"] == "yes",
		AppendFsync: cfg["appendfsync"],
		Snapshots:   strings.TrimSpace(save["save"]) != "",
	}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		switch k {
		case "role":
			d.Role = v
		case "connected_slaves":
			d.Replicas, _ = strconv.Atoi(v)
		}
	}
	return d, nil
}
