-- See sql/postgres/0002_inventory.sql.
CREATE TABLE inventory_reservation (
    order_id    TEXT NOT NULL CONSTRAINT ck_inventory_reservation_order_id_length CHECK (length(order_id) <= 64),
    message_id  TEXT NOT NULL,
    reserved_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    CONSTRAINT pk_inventory_reservation PRIMARY KEY (order_id)
) WITHOUT ROWID;

CREATE TABLE inventory_reservation_line (
    order_id TEXT    NOT NULL,
    line_no  INTEGER NOT NULL,
    sku      TEXT    NOT NULL CONSTRAINT ck_inventory_reservation_line_sku_length CHECK (length(sku) <= 64),
    quantity INTEGER NOT NULL,
    CONSTRAINT pk_inventory_reservation_line PRIMARY KEY (order_id, line_no),
    CONSTRAINT fk_inventory_reservation_line_reservation
        FOREIGN KEY (order_id) REFERENCES inventory_reservation (order_id),
    CONSTRAINT ck_inventory_reservation_line_quantity CHECK (quantity > 0)
) WITHOUT ROWID;

CREATE TABLE inventory_stock (
    sku      TEXT    NOT NULL,
    reserved INTEGER NOT NULL,
    CONSTRAINT pk_inventory_stock PRIMARY KEY (sku),
    CONSTRAINT ck_inventory_stock_reserved CHECK (reserved >= 0)
) WITHOUT ROWID;
