-- The reference inventory consumer (orders.order-placed.v1 -> reserve stock).
CREATE TABLE inventory_reservation (
    order_id    varchar(64)  NOT NULL,
    message_id  varchar(128) NOT NULL,
    reserved_at timestamptz  NOT NULL DEFAULT now(),
    CONSTRAINT pk_inventory_reservation PRIMARY KEY (order_id)
);

CREATE TABLE inventory_reservation_line (
    order_id varchar(64) NOT NULL,
    line_no  integer     NOT NULL,
    sku      varchar(64) NOT NULL,
    quantity integer     NOT NULL,
    CONSTRAINT pk_inventory_reservation_line PRIMARY KEY (order_id, line_no),
    CONSTRAINT fk_inventory_reservation_line_reservation
        FOREIGN KEY (order_id) REFERENCES inventory_reservation (order_id),
    CONSTRAINT ck_inventory_reservation_line_quantity CHECK (quantity > 0)
);

-- Reserved quantity per SKU: a deliberately non-idempotent increment, so a repeated effect
-- shows up as a wrong total.
CREATE TABLE inventory_stock (
    sku      varchar(64) NOT NULL,
    reserved bigint      NOT NULL,
    CONSTRAINT pk_inventory_stock PRIMARY KEY (sku),
    CONSTRAINT ck_inventory_stock_reserved CHECK (reserved >= 0)
);
