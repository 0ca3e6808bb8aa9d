async fn run(pool: sqlx::PgPool) -> Result<(), sqlx::Error> {
    let mut pool = pool;
    txbox::sql("SELECT 1").execute(&mut pool).await?;
    Ok(())
}

fn main() {
    let _ = run;
}
