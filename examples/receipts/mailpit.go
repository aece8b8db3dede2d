package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/idemkit/idem/effect"
)

// SMTPMailer is a Mailer over real SMTP (effect.SMTP) whose sends are found
// again by Message-ID in Mailpit's API: the mailbox, not the sender, says
// whether a send whose answer was lost went out.
type SMTPMailer struct {
	SMTP   *effect.SMTP
	API    string // Mailpit's HTTP API, such as http://127.0.0.1:8025
	Domain string // the Message-IDs' domain (effect.WithMessageIDDomain)
	From   string
}

// Send sends the receipt with the key's Message-ID.
func (m *SMTPMailer) Send(ctx context.Context, to, subject, key string) (string, error) {
	return m.SMTP.Send(ctx, key, effect.Email{From: m.From, To: []string{to}, Subject: subject,
		Text: "Thanks for your order.\n"})
}

// Find searches Mailpit for the key's Message-ID.
func (m *SMTPMailer) Find(ctx context.Context, key string) (string, bool, error) {
	n, err := m.Count(ctx, key)
	return effect.MessageID(key, m.Domain), n > 0, err
}

// Count is how many messages Mailpit holds with the key's Message-ID.
func (m *SMTPMailer) Count(ctx context.Context, key string) (int, error) {
	id := strings.Trim(effect.MessageID(key, m.Domain), "<>")
	req, err := http.NewRequestWithContext(ctx, "GET",
		strings.TrimRight(m.API, "/")+"/api/v1/search?query="+url.QueryEscape("message-id:"+id), nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("mailpit search: %s", resp.Status)
	}
	var res struct {
		MessagesCount int `json:"messages_count"`
	}
	err = json.NewDecoder(resp.Body).Decode(&res)
	return res.MessagesCount, err
}
