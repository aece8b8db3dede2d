// Package amqp091 is a stub of github.com/rabbitmq/amqp091-go.
package amqp091

type Delivery struct {
	DeliveryTag uint64
	MessageId   string
	Body        []byte
}
