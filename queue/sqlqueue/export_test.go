package sqlqueue

// DeliveryBodies is deliveryBodies, for the package's external tests.
var DeliveryBodies = deliveryBodies
