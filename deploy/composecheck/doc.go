// Package composecheck validates docker-compose.yml with compose-go, the
// parser docker compose itself uses, since no Docker engine runs where the
// tests do. It is its own module so the product's go.mod does not carry
// compose-go's dependencies.
package composecheck
